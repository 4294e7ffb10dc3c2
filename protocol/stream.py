"""Pure stream builder: model deltas in, ordered server events out (SPEC: ORD-1..ORD-8).

It owns everything clients check for consistency: ``sequence_number`` (0 on
``response.created``, +1 per event of the response), ``output_index`` (order of
``output_item.added``), ``content_index`` and item ids, and the Response snapshot carried by
lifecycle events. It performs no I/O; the engine encodes and sends what it returns.
"""

from __future__ import annotations

import secrets
from typing import Any

import msgspec

from protocol import events as ev
from protocol.items import (
    Compaction,
    CustomToolCall,
    FunctionCall,
    McpCall,
    McpItem,
    Message,
    OutputItem,
    OutputText,
    Reasoning,
    ReasoningText,
    ToolCall,
)
from protocol.response import IncompleteDetails, Response, ResponseErrorInfo, Usage
from protocol.states import IllegalTransition, ResponseState, Step, next_state

_EMPTY: list[Any] = []


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


class _OpenMessage:
    __slots__ = ("content_index", "item_id", "output_index", "pieces")

    def __init__(self, item_id: str, output_index: int) -> None:
        self.item_id = item_id
        self.output_index = output_index
        self.content_index = 0
        self.pieces: list[str] = []


class _OpenReasoning:
    __slots__ = ("item_id", "output_index", "pieces")

    def __init__(self, item_id: str, output_index: int) -> None:
        self.item_id = item_id
        self.output_index = output_index
        self.pieces: list[str] = []

    def item(self, status: Any) -> Reasoning:
        text = ReasoningText(text="".join(self.pieces))
        return Reasoning(id=self.item_id, summary=[], content=[text], status=status)


class _OpenCall:
    """An open function call, or (``custom``) a custom tool call whose input is free text."""

    __slots__ = ("call_id", "custom", "item_id", "name", "namespace", "output_index", "pieces")

    def __init__(
        self,
        item_id: str,
        output_index: int,
        call_id: str,
        name: str,
        namespace: str | None,
        custom: bool,
    ) -> None:
        self.item_id = item_id
        self.output_index = output_index
        self.call_id = call_id
        self.name = name
        self.namespace = namespace
        self.custom = custom
        self.pieces: list[str] = []

    def item(self, status: Any) -> ToolCall:
        text = "".join(self.pieces)
        if self.custom:
            return CustomToolCall(
                id=self.item_id,
                call_id=self.call_id,
                name=self.name,
                input=text,
                status=status,
                namespace=self.namespace,
            )
        return FunctionCall(
            id=self.item_id,
            call_id=self.call_id,
            name=self.name,
            arguments=text,
            status=status,
            namespace=self.namespace,
        )


class _OpenHosted:
    """An open hosted-tool item (remote MCP, MCP-5, MCP-7): complete when added, its progress
    events between ``output_item.added`` and ``.done``."""

    __slots__ = ("item", "output_index")

    def __init__(self, item: McpItem, output_index: int) -> None:
        self.item = item
        self.output_index = output_index


class _NumberedEvents:
    """One response's event numbering and state, and the notices that take a number without
    being part of its items (inject, steering). ``ResponseStream`` adds the items and the
    lifecycle on top."""

    def __init__(self, response: Response, stream_id: str | None = None) -> None:
        self.response = response
        self.stream_id = stream_id
        self.state = ResponseState.NEW
        self._seq = 0

    # ------------------------------------------------------------------ bookkeeping
    @property
    def id(self) -> str:
        return self.response.id

    @property
    def next_sequence_number(self) -> int:
        return self._seq

    @property
    def output(self) -> list[OutputItem]:
        return self.response.output

    def _step(self, step: Step) -> int:
        self.state = next_state(self.state, step)
        seq = self._seq
        self._seq += 1
        return seq

    def _snapshot(self) -> Response:
        # Lifecycle events carry a copy, so later mutation never changes an emitted event.
        return msgspec.structs.replace(self.response, output=list(self.response.output))

    # ------------------------------------------------------------------ notices
    def inject_created(self) -> ev.InjectCreated:
        # A notice like the steering ones below: a standard-mode target has already completed
        # when it takes the outputs of its calls (INJECT-4).
        seq = self._notice_number()
        return ev.InjectCreated(sequence_number=seq, stream_id=self.stream_id, response_id=self.id)

    # ------------------------------------------------------------------ steering notices
    # Steering notices are not lifecycle steps: they take the response's next sequence number in
    # any state after CREATE, also after its terminal event (``response.steer.pending`` follows
    # ``response.completed``), and change nothing else (STEER-8).
    def _notice_number(self) -> int:
        if self.state is ResponseState.NEW:
            raise _misuse("a steering notice before response.created")
        seq = self._seq
        self._seq += 1
        return seq

    def steer_accepted(self, steer_id: str) -> ev.SteerAccepted:
        return ev.SteerAccepted(
            sequence_number=self._notice_number(),
            stream_id=self.stream_id,
            steer=ev.SteerId(id=steer_id, previous_response_id=self.id),
        )

    def steer_pending(self, steer_id: str, calls: list[ToolCall]) -> ev.SteerPending:
        return ev.SteerPending(
            sequence_number=self._notice_number(),
            stream_id=self.stream_id,
            reason="waiting_for_required_input",
            required_input=[ev.RequiredInput(call_id=c.call_id, name=c.name) for c in calls],
            steer=ev.SteerId(id=steer_id, previous_response_id=self.id),
        )

    def steer_failed(self, steer: ev.SteerRef, code: str, message: str) -> ev.SteerFailed:
        return ev.SteerFailed(
            sequence_number=self._notice_number(),
            stream_id=self.stream_id,
            error=ev.SteerError(code=code, message=message),
            steer=steer,
        )


class _ReasoningItems(_NumberedEvents):
    """The open item, and reasoning items (REASON-2): ``output_item.added`` (a ``reasoning``
    item, empty ``summary`` and ``content``), ``content_part.added`` (``reasoning_text``),
    ``reasoning_text.delta`` …, ``reasoning_text.done``, ``content_part.done``,
    ``output_item.done`` with the whole text as the item's one ``reasoning_text`` part."""

    def __init__(self, response: Response, stream_id: str | None = None) -> None:
        super().__init__(response, stream_id)
        self._open: _OpenMessage | _OpenCall | _OpenReasoning | _OpenHosted | None = None

    @property
    def has_open_item(self) -> bool:
        return self._open is not None

    @property
    def reasoning_open(self) -> bool:
        return isinstance(self._open, _OpenReasoning)

    def _require_closed(self) -> None:
        if self._open is not None:
            raise _misuse("an output item is still open")

    def add_reasoning(self) -> list[ev.ServerEvent]:
        self._require_closed()
        first = self._step(Step.OUTPUT)  # checked before any state changes (STATE-2)
        index = len(self.response.output)
        item_id = new_id("rs")
        self._open = _OpenReasoning(item_id, index)
        added = Reasoning(id=item_id, summary=[], content=[], status="in_progress")
        return [
            ev.OutputItemAdded(
                sequence_number=first, stream_id=self.stream_id, output_index=index, item=added
            ),
            ev.ContentPartAdded(
                sequence_number=self._step(Step.OUTPUT),
                stream_id=self.stream_id,
                item_id=item_id,
                output_index=index,
                content_index=0,
                part=ReasoningText(text=""),
            ),
        ]

    def reasoning_delta(self, delta: str) -> ev.ReasoningTextDelta:
        item = self._open
        if not isinstance(item, _OpenReasoning):
            raise _misuse("reasoning_delta without an open reasoning item")
        item.pieces.append(delta)
        return ev.ReasoningTextDelta(
            sequence_number=self._step(Step.OUTPUT),
            stream_id=self.stream_id,
            item_id=item.item_id,
            output_index=item.output_index,
            content_index=0,
            delta=delta,
        )

    def finish_reasoning(self, status: Any = "completed") -> list[ev.ServerEvent]:
        item = self._open
        if not isinstance(item, _OpenReasoning):
            raise _misuse("finish_reasoning without an open reasoning item")
        self._open = None
        done = item.item(status)
        self.response.output.append(done)
        part = ReasoningText(text="".join(item.pieces))
        item_id, index = item.item_id, item.output_index
        return [
            ev.ReasoningTextDone(
                sequence_number=self._step(Step.OUTPUT),
                stream_id=self.stream_id,
                item_id=item_id,
                output_index=index,
                content_index=0,
                text=part.text,
            ),
            ev.ContentPartDone(
                sequence_number=self._step(Step.OUTPUT),
                stream_id=self.stream_id,
                item_id=item_id,
                output_index=index,
                content_index=0,
                part=part,
            ),
            ev.OutputItemDone(
                sequence_number=self._step(Step.OUTPUT),
                stream_id=self.stream_id,
                output_index=item.output_index,
                item=done,
            ),
        ]


class ResponseStream(_ReasoningItems):
    """Builds the event sequence of one response. One instance per response id."""

    # ------------------------------------------------------------------ lifecycle
    def created(self) -> ev.ResponseCreated:
        seq = self._step(Step.CREATE)
        return ev.ResponseCreated(
            sequence_number=seq, stream_id=self.stream_id, response=self._snapshot()
        )

    def in_progress(self) -> ev.ResponseInProgress:
        seq = self._step(Step.START)
        return ev.ResponseInProgress(
            sequence_number=seq, stream_id=self.stream_id, response=self._snapshot()
        )

    def suspend(self, pending: list[ToolCall]) -> ev.ResponseDone:
        self._require_closed()
        seq = self._step(Step.SUSPEND)
        calls = [
            ev.PendingCall(call_id=c.call_id, name=c.name, namespace=c.namespace) for c in pending
        ]
        return ev.ResponseDone(
            sequence_number=seq,
            stream_id=self.stream_id,
            response=self._snapshot(),
            pending_calls=calls,
        )

    def resume(self) -> None:
        self.state = next_state(self.state, Step.RESUME)

    def completed(self, usage: Usage, completed_at: int) -> ev.ResponseCompleted:
        self._require_closed()
        seq = self._step(Step.COMPLETE)
        self._finish("completed", usage, completed_at)
        return ev.ResponseCompleted(
            sequence_number=seq, stream_id=self.stream_id, response=self._snapshot()
        )

    def failed(
        self, code: str, message: str, usage: Usage | None, completed_at: int
    ) -> ev.ResponseFailed:
        seq = self._step(Step.FAIL)
        self._abandon_open_item()
        self.response.error = ResponseErrorInfo(code=code, message=message)
        self._finish("failed", usage, completed_at)
        return ev.ResponseFailed(
            sequence_number=seq, stream_id=self.stream_id, response=self._snapshot()
        )

    def incomplete(
        self, reason: str, usage: Usage | None, completed_at: int
    ) -> ev.ResponseIncomplete:
        seq = self._step(Step.INCOMPLETE)
        self._abandon_open_item()
        self.response.incomplete_details = IncompleteDetails(reason=reason)
        self._finish("incomplete", usage, completed_at)
        return ev.ResponseIncomplete(
            sequence_number=seq, stream_id=self.stream_id, response=self._snapshot()
        )

    def _finish(self, status: Any, usage: Usage | None, completed_at: int) -> None:
        self.response.status = status
        self.response.usage = usage
        self.response.completed_at = completed_at

    # ------------------------------------------------------------------ message items
    def add_message(self) -> list[ev.ServerEvent]:
        self._require_closed()
        first = self._step(Step.OUTPUT)  # checked before any state changes (STATE-2)
        index = len(self.response.output)
        item_id = new_id("msg")
        self._open = _OpenMessage(item_id, index)
        added_item = Message(id=item_id, role="assistant", status="in_progress", content=[])
        part = OutputText(text="", annotations=[], logprobs=[])
        return [
            ev.OutputItemAdded(
                sequence_number=first,
                stream_id=self.stream_id,
                output_index=index,
                item=added_item,
            ),
            ev.ContentPartAdded(
                sequence_number=self._step(Step.OUTPUT),
                stream_id=self.stream_id,
                item_id=item_id,
                output_index=index,
                content_index=0,
                part=part,
            ),
        ]

    def text_delta(self, delta: str) -> ev.OutputTextDelta:
        item = self._open
        if not isinstance(item, _OpenMessage):
            raise _misuse("text_delta without an open message")
        item.pieces.append(delta)
        return ev.OutputTextDelta(
            sequence_number=self._step(Step.OUTPUT),
            stream_id=self.stream_id,
            item_id=item.item_id,
            output_index=item.output_index,
            content_index=item.content_index,
            delta=delta,
            logprobs=_EMPTY,
        )

    def finish_message(self, status: Any = "completed") -> list[ev.ServerEvent]:
        item = self._open
        if not isinstance(item, _OpenMessage):
            raise _misuse("finish_message without an open message")
        self._open = None
        text = "".join(item.pieces)
        part = OutputText(text=text, annotations=[], logprobs=[])
        done = Message(id=item.item_id, role="assistant", status=status, content=[part])
        self.response.output.append(done)
        return [
            ev.OutputTextDone(
                sequence_number=self._step(Step.OUTPUT),
                stream_id=self.stream_id,
                content_index=0,
                text=text,
                logprobs=[],
                item_id=item.item_id,
                output_index=item.output_index,
            ),
            ev.ContentPartDone(
                sequence_number=self._step(Step.OUTPUT),
                stream_id=self.stream_id,
                content_index=0,
                part=part,
                item_id=item.item_id,
                output_index=item.output_index,
            ),
            ev.OutputItemDone(
                sequence_number=self._step(Step.OUTPUT),
                stream_id=self.stream_id,
                output_index=item.output_index,
                item=done,
            ),
        ]

    # ------------------------------------------------------------------ tool calls
    def add_function_call(
        self, name: str, call_id: str, namespace: str | None = None, custom: bool = False
    ) -> ev.OutputItemAdded:
        """Open a function call (``custom``: a custom tool call, TOOL-3)."""
        self._require_closed()
        seq = self._step(Step.OUTPUT)  # checked before any state changes (STATE-2)
        index = len(self.response.output)
        item_id = new_id("ctc" if custom else "fc")
        call = _OpenCall(item_id, index, call_id, name, namespace, custom)
        self._open = call
        return ev.OutputItemAdded(
            sequence_number=seq,
            stream_id=self.stream_id,
            output_index=index,
            item=call.item("in_progress"),
        )

    def arguments_delta(
        self, delta: str
    ) -> ev.FunctionCallArgumentsDelta | ev.CustomToolCallInputDelta:
        call = self._open
        if not isinstance(call, _OpenCall):
            raise _misuse("arguments_delta without an open function call")
        call.pieces.append(delta)
        kind = ev.CustomToolCallInputDelta if call.custom else ev.FunctionCallArgumentsDelta
        return kind(
            sequence_number=self._step(Step.OUTPUT),
            stream_id=self.stream_id,
            item_id=call.item_id,
            output_index=call.output_index,
            delta=delta,
        )

    def finish_function_call(self) -> tuple[ToolCall, list[ev.ServerEvent]]:
        call = self._open
        if not isinstance(call, _OpenCall):
            raise _misuse("finish_function_call without an open function call")
        self._open = None
        done = call.item("completed")
        self.response.output.append(done)
        seq = self._step(Step.OUTPUT)
        finished: ev.ServerEvent
        if isinstance(done, CustomToolCall):
            finished = ev.CustomToolCallInputDone(
                sequence_number=seq,
                stream_id=self.stream_id,
                item_id=call.item_id,
                output_index=call.output_index,
                input=done.input,
            )
        else:
            finished = ev.FunctionCallArgumentsDone(
                sequence_number=seq,
                stream_id=self.stream_id,
                item_id=call.item_id,
                output_index=call.output_index,
                arguments=done.arguments,
                name=call.name,
            )
        return done, [
            finished,
            ev.OutputItemDone(
                sequence_number=self._step(Step.OUTPUT),
                stream_id=self.stream_id,
                output_index=call.output_index,
                item=done,
            ),
        ]

    # ------------------------------------------------------------------ compaction
    def add_compaction(self, item: Compaction) -> list[ev.ServerEvent]:
        """A compaction item (COMPACT-3, COMPACT-7): it is complete when it appears, so
        ``output_item.added`` and ``output_item.done`` carry the same item, with the
        ``response.compaction.compacting`` progress event between them."""
        self._require_closed()
        first = self._step(Step.OUTPUT)
        index = len(self.response.output)
        self.response.output.append(item)
        return [
            ev.OutputItemAdded(
                sequence_number=first, stream_id=self.stream_id, output_index=index, item=item
            ),
            ev.CompactionCompacting(
                sequence_number=self._step(Step.OUTPUT),
                stream_id=self.stream_id,
                item_id=item.id or "",
                output_index=index,
            ),
            ev.OutputItemDone(
                sequence_number=self._step(Step.OUTPUT),
                stream_id=self.stream_id,
                output_index=index,
                item=item,
            ),
        ]

    # ------------------------------------------------------------------ hosted tools (MCP-5, MCP-7)
    def open_hosted(self, item: McpItem) -> ev.OutputItemAdded:
        """Add a hosted-tool item (``mcp_list_tools``, ``mcp_call``); it stays open for its
        progress events (``hosted_event``) until ``close_hosted``."""
        self._require_closed()
        seq = self._step(Step.OUTPUT)
        index = len(self.response.output)
        self._open = _OpenHosted(item, index)
        return ev.OutputItemAdded(
            sequence_number=seq, stream_id=self.stream_id, output_index=index, item=item
        )

    def hosted_event(self, kind: type[ev.McpProgress], **fields: str) -> ev.McpProgress:
        """One numbered progress event of the open hosted item (``item_id``, ``output_index``
        filled in)."""
        item = self._open
        if not isinstance(item, _OpenHosted):
            raise _misuse("hosted_event without an open hosted item")
        return kind(
            sequence_number=self._step(Step.OUTPUT),
            stream_id=self.stream_id,
            item_id=item.item.id,
            output_index=item.output_index,
            **fields,
        )

    def close_hosted(self, done: McpItem) -> ev.OutputItemDone:
        item = self._open
        if not isinstance(item, _OpenHosted):
            raise _misuse("close_hosted without an open hosted item")
        self._open = None
        self.response.output.append(done)
        return ev.OutputItemDone(
            sequence_number=self._step(Step.OUTPUT),
            stream_id=self.stream_id,
            output_index=item.output_index,
            item=done,
        )

    def add_hosted(self, item: McpItem) -> list[ev.ServerEvent]:
        """A hosted-tool item complete at once (``mcp_approval_request``, MCP-9)."""
        return [self.open_hosted(item), self.close_hosted(item)]

    # ------------------------------------------------------------------ helpers
    def _abandon_open_item(self) -> None:
        """On failure, keep what was produced so far as an ``incomplete`` item (ORD-8)."""
        item, self._open = self._open, None
        if isinstance(item, _OpenMessage):
            part = OutputText(text="".join(item.pieces), annotations=[], logprobs=[])
            self.response.output.append(
                Message(id=item.item_id, role="assistant", status="incomplete", content=[part])
            )
        elif isinstance(item, _OpenCall | _OpenReasoning):
            self.response.output.append(item.item("incomplete"))
        elif isinstance(item, _OpenHosted):
            kept = item.item
            if isinstance(kept, McpCall):
                kept = msgspec.structs.replace(kept, status="incomplete")
            self.response.output.append(kept)


def _misuse(what: str) -> Exception:
    return IllegalTransition(what)
