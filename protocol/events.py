"""Client and server events, tagged on ``type`` (SPEC: EV-1..EV-4, APPEND-1..APPEND-6).

Server events omit ``stream_id`` when it is unset (the default lane); every other field is always
present, as the openai SDK's event models require.
"""

from __future__ import annotations

from typing import Any, Protocol

import msgspec

from protocol.items import FunctionCall, Message, OutputItem, OutputText, ReasoningText
from protocol.response import CreateParams, Response

# --------------------------------------------------------------------------- client events


class ResponseCreate(CreateParams, tag="response.create", tag_field="type", kw_only=True):
    pass


class ResponseAppend(msgspec.Struct, tag="response.append", tag_field="type", kw_only=True):
    """Experimental mode: commit tool outputs into the suspended rollout ``response_id``."""

    response_id: str
    input: list[Any]


class ResponseInject(msgspec.Struct, tag="response.inject", tag_field="type", kw_only=True):
    """OpenAI's beta name for the same operation; answered by inject.created / inject.failed."""

    response_id: str
    input: list[Any]


class ResponseSteer(msgspec.Struct, tag="response.steer", tag_field="type", kw_only=True):
    """Steering input for a live response of this connection (STEER-1..STEER-9)."""

    previous_response_id: str
    input: str | list[Any]


class ResponseProcessed(msgspec.Struct, tag="response.processed", tag_field="type", kw_only=True):
    """Codex's acknowledgement that it has consumed the response ``response_id`` (WS-15):
    accepted and counted, never answered."""

    response_id: str


ClientEvent = ResponseCreate | ResponseAppend | ResponseInject | ResponseSteer | ResponseProcessed
CLIENT_EVENT_TYPES = (
    "response.create",
    "response.append",
    "response.inject",
    "response.steer",
    "response.processed",
)

# --------------------------------------------------------------------------- server events


class _Event(msgspec.Struct, tag_field="type", kw_only=True, omit_defaults=True):
    sequence_number: int
    stream_id: str | None = None


class ResponseCreated(_Event, tag="response.created"):
    response: Response


class ResponseInProgress(_Event, tag="response.in_progress"):
    response: Response


class ResponseCompleted(_Event, tag="response.completed"):
    response: Response


class ResponseFailed(_Event, tag="response.failed"):
    response: Response


class ResponseIncomplete(_Event, tag="response.incomplete"):
    response: Response


class OutputItemAdded(_Event, tag="response.output_item.added"):
    output_index: int
    item: OutputItem


class OutputItemDone(_Event, tag="response.output_item.done"):
    output_index: int
    item: OutputItem


class ContentPartAdded(_Event, tag="response.content_part.added"):
    item_id: str
    output_index: int
    content_index: int
    part: OutputText | ReasoningText


class ContentPartDone(_Event, tag="response.content_part.done"):
    item_id: str
    output_index: int
    content_index: int
    part: OutputText | ReasoningText


class OutputTextDelta(_Event, tag="response.output_text.delta"):
    item_id: str
    output_index: int
    content_index: int
    delta: str
    logprobs: list[Any]


class OutputTextDone(_Event, tag="response.output_text.done"):
    item_id: str
    output_index: int
    content_index: int
    text: str
    logprobs: list[Any]


class ReasoningTextDelta(_Event, tag="response.reasoning_text.delta"):
    """A piece of a reasoning item's text (REASON-2)."""

    item_id: str
    output_index: int
    content_index: int
    delta: str


class ReasoningTextDone(_Event, tag="response.reasoning_text.done"):
    item_id: str
    output_index: int
    content_index: int
    text: str


class FunctionCallArgumentsDelta(_Event, tag="response.function_call_arguments.delta"):
    item_id: str
    output_index: int
    delta: str


class FunctionCallArgumentsDone(_Event, tag="response.function_call_arguments.done"):
    item_id: str
    output_index: int
    arguments: str
    name: str


class CustomToolCallInputDelta(_Event, tag="response.custom_tool_call_input.delta"):
    item_id: str
    output_index: int
    delta: str


class CustomToolCallInputDone(_Event, tag="response.custom_tool_call_input.done"):
    item_id: str
    output_index: int
    input: str


class CompactionCompacting(_Event, tag="response.compaction.compacting"):
    """The compaction item ``item_id`` is being written (COMPACT-7): between its
    ``output_item.added`` and ``.done``; it carries no summary content."""

    item_id: str
    output_index: int


class _ItemProgress(_Event):
    item_id: str
    output_index: int


# Remote MCP progress events (MCP-5, MCP-7): between the item's ``output_item.added`` and
# ``.done``.
class McpListToolsInProgress(_ItemProgress, tag="response.mcp_list_tools.in_progress"):
    pass


class McpListToolsCompleted(_ItemProgress, tag="response.mcp_list_tools.completed"):
    pass


class McpListToolsFailed(_ItemProgress, tag="response.mcp_list_tools.failed"):
    pass


class McpCallInProgress(_ItemProgress, tag="response.mcp_call.in_progress"):
    pass


class McpCallCompleted(_ItemProgress, tag="response.mcp_call.completed"):
    pass


class McpCallFailed(_ItemProgress, tag="response.mcp_call.failed"):
    pass


class McpCallArgumentsDelta(_ItemProgress, tag="response.mcp_call_arguments.delta"):
    delta: str


class McpCallArgumentsDone(_ItemProgress, tag="response.mcp_call_arguments.done"):
    arguments: str


McpProgress = (
    McpListToolsInProgress
    | McpListToolsCompleted
    | McpListToolsFailed
    | McpCallInProgress
    | McpCallCompleted
    | McpCallFailed
    | McpCallArgumentsDelta
    | McpCallArgumentsDone
)


class PendingCall(msgspec.Struct, omit_defaults=True):
    call_id: str
    name: str
    namespace: str | None = None


class ResponseDone(_Event, tag="response.done"):
    """Experimental mode: the rollout suspended waiting for these tool outputs (APPEND-2)."""

    response: Response
    pending_calls: list[PendingCall]


class InjectCreated(_Event, tag="response.inject.created"):
    response_id: str


class InjectError(msgspec.Struct):
    code: str
    message: str


class InjectFailed(_Event, tag="response.inject.failed"):
    response_id: str
    error: InjectError
    input: list[Any]


class SteerError(msgspec.Struct):
    code: str
    message: str
    type: str = "invalid_request_error"


class SteerRef(msgspec.Struct, omit_defaults=True):
    """A steer that could not be committed: its input is returned (STEER-7)."""

    previous_response_id: str
    input: str | list[Any]
    id: str | None = None  # absent when the steer failed before an id was allocated


class SteerFailed(_Event, tag="response.steer.failed"):
    error: SteerError
    steer: SteerRef


class SteerId(msgspec.Struct):
    id: str
    previous_response_id: str


class SteerAccepted(_Event, tag="response.steer.accepted"):
    """The server owns the steering input; the successor's ``response.created`` commits it."""

    steer: SteerId


class RequiredInput(msgspec.Struct, tag="function_call_output", tag_field="type"):
    """A stub the client fills with the tool's result (``response.steer.pending``)."""

    call_id: str
    name: str


class SteerPending(_Event, tag="response.steer.pending"):
    """Accepted input waits for the client's tool outputs; it joins the next create (STEER-5)."""

    reason: str
    required_input: list[RequiredInput]
    steer: SteerId


class ErrorBody(msgspec.Struct):
    type: str
    code: str | None
    message: str
    param: str | None


class ErrorEvent(msgspec.Struct, tag="error", tag_field="type", kw_only=True, omit_defaults=True):
    """The WebSocket error envelope (ERR-1). ``status`` is always present; ``headers`` only
    when the error has response headers (CODEX-24)."""

    status: int
    error: ErrorBody
    sequence_number: int | None = None
    stream_id: str | None = None
    # What an HTTP answer would carry as headers (RATE-5); Codex reads them from this field.
    headers: dict[str, str] | None = None


ServerEvent = (
    ResponseCreated
    | ResponseInProgress
    | ResponseCompleted
    | ResponseFailed
    | ResponseIncomplete
    | OutputItemAdded
    | OutputItemDone
    | ContentPartAdded
    | ContentPartDone
    | OutputTextDelta
    | OutputTextDone
    | ReasoningTextDelta
    | ReasoningTextDone
    | FunctionCallArgumentsDelta
    | FunctionCallArgumentsDone
    | CustomToolCallInputDelta
    | CustomToolCallInputDone
    | CompactionCompacting
    | McpProgress
    | ResponseDone
    | InjectCreated
    | InjectFailed
    | SteerFailed
    | SteerAccepted
    | SteerPending
    | ErrorEvent
)

TERMINAL_TYPES = frozenset({"response.completed", "response.failed", "response.incomplete"})


class Sink(Protocol):
    """Whatever carries server events to one client: a WebSocket, an SSE stream, a timing or
    recording wrapper of either, or nothing (a parked rollout's). One concept, used by the
    rollout and the benchmark's clock alike."""

    async def send(self, event: ServerEvent) -> None: ...


__all__ = [
    "CLIENT_EVENT_TYPES",
    "TERMINAL_TYPES",
    "ClientEvent",
    "FunctionCall",
    "Message",
    "ServerEvent",
    "Sink",
]
