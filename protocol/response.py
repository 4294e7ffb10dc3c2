"""The Response object, usage, tools and create parameters (SPEC: RESP-1..RESP-4).

Field types follow the openai SDK's ``Response`` model and the Open Responses document's
``ResponseResource`` (CONF-3): every field the document requires is always written; numbers are
never null (``temperature``, ``top_p``, ``presence_penalty``, ``frequency_penalty``,
``top_logprobs`` default to their documented values), and required-but-nullable fields
(``error``, ``instructions`` …) are written as null.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, Literal

import msgspec

from protocol.items import InputItem, OutputItem
from protocol.tools import FunctionTool, ToolChoice, ToolChoiceFunction, Toolset, parse_tools

ResponseStatus = Literal["completed", "failed", "in_progress", "cancelled", "queued", "incomplete"]


class InputTokensDetails(msgspec.Struct):
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(msgspec.Struct):
    reasoning_tokens: int = 0


class Usage(msgspec.Struct):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_tokens_details: InputTokensDetails = msgspec.field(default_factory=InputTokensDetails)
    output_tokens_details: OutputTokensDetails = msgspec.field(default_factory=OutputTokensDetails)
    # Extension (USE-3): present and true only when output tokens were counted by our tokenizer
    # because the upstream reported no usage.
    estimated: bool | msgspec.UnsetType = msgspec.UNSET


class ResponseErrorInfo(msgspec.Struct):
    code: str
    message: str


class IncompleteDetails(msgspec.Struct):
    reason: str


class ReasoningConfig(msgspec.Struct):
    """A request's ``reasoning``: its effort and summary settings (not the ``reasoning`` item,
    ``protocol.items.Reasoning``)."""

    effort: str | None = None
    summary: str | None = None


class SafetyFinding(msgspec.Struct):
    kind: str
    item_index: int
    score: float = 1.0


class SafetyReport(msgspec.Struct):
    """Extension field (SAFE-4): what the safety scan found in this request's input."""

    policy: str
    findings: list[SafetyFinding]


class SampleTokens(msgspec.Struct, kw_only=True):
    """One sampling step in the model's own tokens (``include: ["rollout.token_ids"]``, TOK-9)."""

    prompt_tokens: int  # the whole prompt the model read
    prompt_token_ids: list[int]  # its new part: rendered since the model's previous answer
    item_ids: list[str]  # the output items this step produced
    token_ids: list[int]  # the ids the model sampled, exactly
    logprobs: list[float | None]  # one per sampled id (null where the server gave none)


class RolloutTokens(msgspec.Struct, kw_only=True):
    samples: list[SampleTokens] = msgspec.field(default_factory=list)


class ConversationRef(msgspec.Struct):
    """``{"id": "conv_…"}``: a response's conversation (CONV-5)."""

    id: str


class Response(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: ResponseStatus = "in_progress"
    background: bool = False
    completed_at: int | None = None
    error: ResponseErrorInfo | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    model: str
    output: list[OutputItem] = msgspec.field(default_factory=list)
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    reasoning: ReasoningConfig = msgspec.field(default_factory=ReasoningConfig)
    service_tier: str = "default"
    store: bool = True
    temperature: float = 1.0
    text: dict[str, Any] = msgspec.field(default_factory=lambda: {"format": {"type": "text"}})
    tool_choice: ToolChoice = "auto"
    tools: list[msgspec.Raw] = msgspec.field(default_factory=list)  # as sent (TOOL-1)
    top_logprobs: int = 0
    top_p: float = 1.0
    # Required numbers of the Open Responses Response (CONF-3); echoed, default 0.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    truncation: str = "disabled"
    usage: Usage | None = None
    user: str | None = None
    metadata: dict[str, str] = msgspec.field(default_factory=dict)
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    safety: SafetyReport | None = None
    # The conversation a create named (CONV-5); absent otherwise.
    conversation: ConversationRef | msgspec.UnsetType = msgspec.UNSET
    # Only with ``include: ["rollout.token_ids"]`` on a ``tokens`` route (TOK-9).
    rollout_tokens: RolloutTokens | msgspec.UnsetType = msgspec.UNSET


class CreateParams(msgspec.Struct, kw_only=True, dict=True):
    """The body of ``POST /v1/responses``; ``response.create`` adds ``type`` and WS-only fields.

    Unknown fields are accepted and ignored (LEN-1). ``input`` items are decoded in a second
    step (see ``protocol.codec``) because the Agents SDK sends messages without a ``type``.
    ``tools`` are kept raw (echoed exactly, TOOL-1); ``toolset`` is their typed view, built
    once when the codec decodes the request.
    """

    model: str | None = None
    input: str | list[Any] = msgspec.field(default_factory=list)
    instructions: str | None = None
    previous_response_id: str | None = None
    tools: list[msgspec.Raw] = msgspec.field(default_factory=list)
    tool_choice: ToolChoice = "auto"
    parallel_tool_calls: bool = True
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    truncation: str | None = None
    text: dict[str, Any] | None = None
    reasoning: ReasoningConfig | None = None
    include: list[str] | None = None
    metadata: dict[str, Any] | None = None  # checked in the engine: param is metadata.<key>
    store: bool = True
    stream: bool = False
    background: bool = False
    user: str | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    conversation: Any = None
    # Compaction past a token threshold (COMPACT-3); checked in the engine.
    context_management: Any = None
    # WebSocket fields (WS-2): stream_id is ignored over HTTP; generate=false works on both.
    generate: bool = True
    stream_id: str | None = None
    # Experimental append mode opt-in (APPEND-1): "append" or "standard"; None = connection default.
    rollout_mode: Literal["append", "standard"] | None = None

    @cached_property
    def toolset(self) -> Toolset:
        return parse_tools(self.tools)


class HttpCreateParams(CreateParams, kw_only=True, dict=True):
    """An HTTP create's body: its ``input`` items are kept raw (``msgspec.Raw``, each one JSON
    value) until ``protocol.codec.parse_input`` decodes them, so that the items a resend sends
    again byte for byte are never decoded twice (COMPAT-7)."""

    input: str | list[msgspec.Raw] = msgspec.field(default_factory=list)


class CompactParams(msgspec.Struct, kw_only=True):
    """The body of ``POST /v1/responses/compact`` (COMPACT-1). ``model`` is required; unknown
    fields are accepted and ignored (LEN-1)."""

    model: str
    input: str | list[Any] | None = None
    previous_response_id: str | None = None
    instructions: str | None = None
    prompt_cache_key: str | None = None


class CompactedResponse(msgspec.Struct, kw_only=True):
    """The compacted window: the kept client messages and one ``compaction`` item."""

    id: str
    object: Literal["response.compaction"] = "response.compaction"
    created_at: int
    output: list[InputItem]
    usage: Usage


class InputTokenCount(msgspec.Struct, kw_only=True):
    """The answer of ``POST /v1/responses/input_tokens`` (TOKENS-1)."""

    object: Literal["response.input_tokens"] = "response.input_tokens"
    input_tokens: int


__all__ = ["CreateParams", "FunctionTool", "Response", "ToolChoice", "ToolChoiceFunction"]
