"""Pure stream builder: model deltas in, ordered server events out (SPEC: ORD-1..ORD-8).

It owns everything clients check for consistency: ``sequence_number`` (0 on
``response.created``, +1 per event of the response), ``output_index`` (order of
``output_item.added``), ``content_index`` and item ids, and the Response snapshot carried by
lifecycle events. It performs no I/O; the engine encodes and sends what it returns.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass
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


_RANDOM_HEX: list[str] = []  # 128-bit ids drawn ahead from the OS's CSPRNG, 256 a call
_POOL_IDS = 256


def _refill() -> None:
    raw = secrets.token_hex(16 * _POOL_IDS)
    _RANDOM_HEX.extend(raw[n : n + 32] for n in range(0, len(raw), 32))


# A forked worker must not hand out the ids its parent drew: it draws its own.
os.register_at_fork(after_in_child=_RANDOM_HEX.clear)


def new_id(prefix: str) -> str:
    """``<prefix>_`` and 128 random bits in hex (one ``getrandom`` call per 256 ids)."""
    if not _RANDOM_HEX:
        _refill()
    return f"{prefix}_{_RANDOM_HEX.pop()}"


# ---------------------------------------------------------------------- the open items, per kind
# Every streamed output item opens with ``output_item.added`` (and ``content_part.added`` when
# it has a content part), takes deltas, and closes with its ``*.done`` event, the part's
# ``content_part.done`` and ``output_item.done`` (ORD-1..ORD-5, REASON-2, TOOL-3). What differs
# between kinds is data, so it is one table (``KINDS``, a ``_Kind`` per row), as ``states.py``
# keeps the transitions: the id prefix, the item as added and as done, the content part, the
# delta and done events. Another streamed kind is one more row.

Part = OutputText | ReasoningText


class _Open:
    """The one item being streamed: its kind, ids, the call it names (calls only) and the
    pieces of text (message or reasoning text, call arguments or custom input) so far."""

    __slots__ = (
        "call_id",
        "item_id",
        "kind",
        "name",
        "namespace",
        "output_index",
        "pieces",
        "sealed",
    )

    def __init__(
        self,
        kind: _Kind,
        item_id: str,
        output_index: int,
        call: tuple[str, str, str | None] | None,
    ) -> None:
        self.kind = kind
        self.item_id = item_id
        self.output_index = output_index
        self.call_id, self.name, self.namespace = call or ("", "", None)
        self.pieces: list[str] = []
        self.sealed: str | None = None  # a reasoning item's blob, when the client asked (SEAL-1)

    @property
    def text(self) -> str:
        return "".join(self.pieces)


@dataclass(frozen=True, slots=True)
class _Kind:
    """How one kind of output item streams: a row of ``KINDS``."""

    prefix: str  # of its item id
    added: Callable[[_Open], OutputItem]  # the item ``output_item.added`` carries
    done: Callable[[_Open, Any], OutputItem]  # the item with its text, in a status
    part: Callable[[str], Part] | None  # its one content part (index 0), or none (calls)
    delta: Callable[[_Open, int, str | None, str], ev.ServerEvent]
    text_done: Callable[[_Open, int, str | None, OutputItem], ev.ServerEvent]


def _output_text(text: str) -> OutputText:
    return OutputText(text=text, annotations=[], logprobs=[])


def _message_done(o: _Open, status: Any) -> Message:
    return Message(id=o.item_id, role="assistant", status=status, content=[_output_text(o.text)])


def _reasoning_done(o: _Open, status: Any) -> Reasoning:
    content = [ReasoningText(text=o.text)]
    return Reasoning(
        id=o.item_id, summary=[], content=content, encrypted_content=o.sealed, status=status
    )


def _function_call(o: _Open, status: Any) -> FunctionCall:
    return FunctionCall(
        id=o.item_id,
        call_id=o.call_id,
        name=o.name,
        arguments=o.text,
        status=status,
        namespace=o.namespace,
    )


def _custom_call(o: _Open, status: Any) -> CustomToolCall:
    return CustomToolCall(
        id=o.item_id,
        call_id=o.call_id,
        name=o.name,
        input=o.text,
        status=status,
        namespace=o.namespace,
    )


def _text_delta(o: _Open, seq: int, stream_id: str | None, delta: str) -> ev.ServerEvent:
    return ev.OutputTextDelta(
        sequence_number=seq,
        stream_id=stream_id,
        item_id=o.item_id,
        output_index=o.output_index,
        content_index=0,
        delta=delta,
        logprobs=_EMPTY,
    )


def _text_done(o: _Open, seq: int, stream_id: str | None, item: OutputItem) -> ev.ServerEvent:
    return ev.OutputTextDone(
        sequence_number=seq,
        stream_id=stream_id,
        content_index=0,
        text=o.text,
        logprobs=[],
        item_id=o.item_id,
        output_index=o.output_index,
    )


def _reasoning_delta(o: _Open, seq: int, stream_id: str | None, delta: str) -> ev.ServerEvent:
    return ev.ReasoningTextDelta(
        sequence_number=seq,
        stream_id=stream_id,
        item_id=o.item_id,
        output_index=o.output_index,
        content_index=0,
        delta=delta,
    )


def _reasoning_text_done(
    o: _Open, seq: int, stream_id: str | None, item: OutputItem
) -> ev.ServerEvent:
    return ev.ReasoningTextDone(
        sequence_number=seq,
        stream_id=stream_id,
        item_id=o.item_id,
        output_index=o.output_index,
        content_index=0,
        text=o.text,
    )


def _arguments_delta(o: _Open, seq: int, stream_id: str | None, delta: str) -> ev.ServerEvent:
    return ev.FunctionCallArgumentsDelta(
        sequence_number=seq,
        stream_id=stream_id,
        item_id=o.item_id,
        output_index=o.output_index,
        delta=delta,
    )


def _arguments_done(o: _Open, seq: int, stream_id: str | None, item: OutputItem) -> ev.ServerEvent:
    assert isinstance(item, FunctionCall)
    return ev.FunctionCallArgumentsDone(
        sequence_number=seq,
        stream_id=stream_id,
        item_id=o.item_id,
        output_index=o.output_index,
        arguments=item.arguments,
        name=o.name,
    )


def _input_delta(o: _Open, seq: int, stream_id: str | None, delta: str) -> ev.ServerEvent:
    return ev.CustomToolCallInputDelta(
        sequence_number=seq,
        stream_id=stream_id,
        item_id=o.item_id,
        output_index=o.output_index,
        delta=delta,
    )


def _input_done(o: _Open, seq: int, stream_id: str | None, item: OutputItem) -> ev.ServerEvent:
    assert isinstance(item, CustomToolCall)
    return ev.CustomToolCallInputDone(
        sequence_number=seq,
        stream_id=stream_id,
        item_id=o.item_id,
        output_index=o.output_index,
        input=item.input,
    )


MESSAGE = _Kind(
    prefix="msg",
    added=lambda o: Message(id=o.item_id, role="assistant", status="in_progress", content=[]),
    done=_message_done,
    part=_output_text,
    delta=_text_delta,
    text_done=_text_done,
)
REASONING = _Kind(  # REASON-2
    prefix="rs",
    added=lambda o: Reasoning(id=o.item_id, summary=[], content=[], status="in_progress"),
    done=_reasoning_done,
    part=lambda text: ReasoningText(text=text),
    delta=_reasoning_delta,
    text_done=_reasoning_text_done,
)
FUNCTION_CALL = _Kind(
    prefix="fc",
    added=lambda o: _function_call(o, "in_progress"),
    done=_function_call,
    part=None,
    delta=_arguments_delta,
    text_done=_arguments_done,
)
CUSTOM_TOOL_CALL = _Kind(  # TOOL-3: its input is free text
    prefix="ctc",
    added=lambda o: _custom_call(o, "in_progress"),
    done=_custom_call,
    part=None,
    delta=_input_delta,
    text_done=_input_done,
)
KINDS = (MESSAGE, REASONING, FUNCTION_CALL, CUSTOM_TOOL_CALL)
_MESSAGES, _REASONINGS, _CALLS = (MESSAGE,), (REASONING,), (FUNCTION_CALL, CUSTOM_TOOL_CALL)


class _OpenHosted:
    """An open hosted-tool item (remote MCP, MCP-5, MCP-7): complete when added, its progress
    events between ``output_item.added`` and ``.done``."""

    __slots__ = ("item", "output_index")

    def __init__(self, item: McpItem, output_index: int) -> None:
        self.item = item
        self.output_index = output_index


class _NumberedEvents:
    """One response's event numbering and state, and the notices that take a number without
    being part of its items (inject, steering). ``_OutputItems`` adds the items,
    ``ResponseStream`` the lifecycle."""

    def __init__(
        self, response: Response, stream_id: str | None = None, full_echo: bool = False
    ) -> None:
        self.response = response
        self.stream_id = stream_id
        self.full_echo = full_echo  # the opening events echo instructions and tools (RESP-5)
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

    def _opening(self) -> Response:
        """RESP-5: ``response.created`` and ``response.in_progress`` carry the Response without
        the request's ``instructions`` and ``tools`` (null and ``[]``): the terminal event, the
        stored response and a non-streaming answer echo them. ``full_echo``: as OpenAI does."""
        if self.full_echo:
            return self._snapshot()
        response = self.response
        return msgspec.structs.replace(
            response, output=list(response.output), instructions=None, tools=[]
        )

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


class _OutputItems(_NumberedEvents):
    """One response's output items as they stream: its one open item (ORD-5), opened, fed and
    closed as the item's row of the table says, and the items complete when added (compaction,
    hosted tools). ``ResponseStream`` adds the lifecycle."""

    def __init__(
        self, response: Response, stream_id: str | None = None, full_echo: bool = False
    ) -> None:
        super().__init__(response, stream_id, full_echo)
        self._open: _Open | None = None
        self._hosted: _OpenHosted | None = None  # a hosted-tool item (MCP-5), outside KINDS

    @property
    def has_open_item(self) -> bool:
        return self._open is not None or self._hosted is not None

    @property
    def reasoning_open(self) -> bool:
        return self._open is not None and self._open.kind is REASONING

    def _require_closed(self) -> None:
        if self._open is not None or self._hosted is not None:
            raise _misuse("an output item is still open")

    def _add(
        self, kind: _Kind, call: tuple[str, str, str | None] | None = None
    ) -> list[ev.ServerEvent]:
        """``output_item.added``, and ``content_part.added`` when the kind has a part."""
        self._require_closed()
        first = self._step(Step.OUTPUT)  # checked before any state changes (STATE-2)
        index = len(self.response.output)
        item = _Open(kind, new_id(kind.prefix), index, call)
        self._open = item
        events: list[ev.ServerEvent] = [
            ev.OutputItemAdded(
                sequence_number=first,
                stream_id=self.stream_id,
                output_index=index,
                item=kind.added(item),
            )
        ]
        if kind.part is not None:
            events.append(
                ev.ContentPartAdded(
                    sequence_number=self._step(Step.OUTPUT),
                    stream_id=self.stream_id,
                    item_id=item.item_id,
                    output_index=index,
                    content_index=0,
                    part=kind.part(""),
                )
            )
        return events

    def _current(self, kinds: tuple[_Kind, ...], misuse: str) -> _Open:
        item = self._open
        if item is None or item.kind not in kinds:
            raise _misuse(misuse)
        return item

    def _close(self, item: _Open, status: Any) -> tuple[OutputItem, list[ev.ServerEvent]]:
        """The kind's ``*.done``, ``content_part.done`` when it has a part, ``output_item.done``."""
        kind, self._open = item.kind, None
        done = kind.done(item, status)
        self.response.output.append(done)
        events = [kind.text_done(item, self._step(Step.OUTPUT), self.stream_id, done)]
        if kind.part is not None:
            events.append(
                ev.ContentPartDone(
                    sequence_number=self._step(Step.OUTPUT),
                    stream_id=self.stream_id,
                    item_id=item.item_id,
                    output_index=item.output_index,
                    content_index=0,
                    part=kind.part(item.text),
                )
            )
        events.append(
            ev.OutputItemDone(
                sequence_number=self._step(Step.OUTPUT),
                stream_id=self.stream_id,
                output_index=item.output_index,
                item=done,
            )
        )
        return done, events

    def _abandon_open_item(self) -> None:
        """On failure, keep what was produced so far as an ``incomplete`` item (ORD-8)."""
        item, self._open = self._open, None
        hosted, self._hosted = self._hosted, None
        if item is not None:
            self.response.output.append(item.kind.done(item, "incomplete"))
        if hosted is not None:
            kept = hosted.item
            if isinstance(kept, McpCall):
                kept = msgspec.structs.replace(kept, status="incomplete")
            self.response.output.append(kept)

    # ------------------------------------------------------------------ message items
    def add_message(self) -> list[ev.ServerEvent]:
        return self._add(MESSAGE)

    # The deltas are the hot path (one per sampled piece): each checks and appends inline.
    def text_delta(self, delta: str) -> ev.ServerEvent:
        item = self._open
        if item is None or item.kind is not MESSAGE:
            raise _misuse("text_delta without an open message")
        item.pieces.append(delta)
        return _text_delta(item, self._step(Step.OUTPUT), self.stream_id, delta)

    def finish_message(self, status: Any = "completed") -> list[ev.ServerEvent]:
        item = self._current(_MESSAGES, "finish_message without an open message")
        return self._close(item, status)[1]

    # ------------------------------------------------------------------ reasoning items
    def add_reasoning(self) -> list[ev.ServerEvent]:
        """REASON-2: a ``reasoning`` item (empty ``summary`` and ``content``), a
        ``reasoning_text`` part, ``reasoning_text.delta`` …, ``reasoning_text.done``, and the
        whole text as the item's one ``reasoning_text`` part."""
        return self._add(REASONING)

    def reasoning_delta(self, delta: str) -> ev.ServerEvent:
        item = self._open
        if item is None or item.kind is not REASONING:
            raise _misuse("reasoning_delta without an open reasoning item")
        item.pieces.append(delta)
        return _reasoning_delta(item, self._step(Step.OUTPUT), self.stream_id, delta)

    def open_reasoning(self) -> tuple[str, str] | None:
        """The open reasoning item's id and its text so far, if one is open."""
        item = self._open
        if item is None or item.kind is not REASONING:
            return None
        return item.item_id, item.text

    def finish_reasoning(
        self, status: Any = "completed", encrypted_content: str | None = None
    ) -> list[ev.ServerEvent]:
        """``encrypted_content``: the item's sealed blob, when the client asked (SEAL-1)."""
        item = self._current(_REASONINGS, "finish_reasoning without an open reasoning item")
        item.sealed = encrypted_content
        return self._close(item, status)[1]

    # ------------------------------------------------------------------ tool calls
    def add_function_call(
        self, name: str, call_id: str, namespace: str | None = None, custom: bool = False
    ) -> ev.ServerEvent:
        """Open a function call (``custom``: a custom tool call, TOOL-3)."""
        kind = CUSTOM_TOOL_CALL if custom else FUNCTION_CALL
        (added,) = self._add(kind, (call_id, name, namespace))
        return added

    def arguments_delta(self, delta: str) -> ev.ServerEvent:
        item = self._open
        if item is None or item.kind not in _CALLS:
            raise _misuse("arguments_delta without an open function call")
        item.pieces.append(delta)
        return item.kind.delta(item, self._step(Step.OUTPUT), self.stream_id, delta)

    def finish_function_call(self) -> tuple[ToolCall, list[ev.ServerEvent]]:
        item = self._current(_CALLS, "finish_function_call without an open function call")
        done, events = self._close(item, "completed")
        assert isinstance(done, FunctionCall | CustomToolCall)
        return done, events

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
        self._hosted = _OpenHosted(item, index)
        return ev.OutputItemAdded(
            sequence_number=seq, stream_id=self.stream_id, output_index=index, item=item
        )

    def hosted_event(self, kind: type[ev.McpProgress], **fields: str) -> ev.McpProgress:
        """One numbered progress event of the open hosted item (``item_id``, ``output_index``
        filled in)."""
        item = self._hosted
        if item is None:
            raise _misuse("hosted_event without an open hosted item")
        return kind(
            sequence_number=self._step(Step.OUTPUT),
            stream_id=self.stream_id,
            item_id=item.item.id,
            output_index=item.output_index,
            **fields,
        )

    def close_hosted(self, done: McpItem) -> ev.OutputItemDone:
        item = self._hosted
        if item is None:
            raise _misuse("close_hosted without an open hosted item")
        self._hosted = None
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


class ResponseStream(_OutputItems):
    """Builds the event sequence of one response. One instance per response id: its numbered
    events and notices (``_NumberedEvents``), its output items (``_OutputItems``) and here its
    lifecycle, each lifecycle event carrying the Response as it stands."""

    # ------------------------------------------------------------------ lifecycle
    def created(self) -> ev.ResponseCreated:
        seq = self._step(Step.CREATE)
        return ev.ResponseCreated(
            sequence_number=seq, stream_id=self.stream_id, response=self._opening()
        )

    def in_progress(self) -> ev.ResponseInProgress:
        seq = self._step(Step.START)
        return ev.ResponseInProgress(
            sequence_number=seq, stream_id=self.stream_id, response=self._opening()
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


def _misuse(what: str) -> Exception:
    return IllegalTransition(what)


def keep_open_item(stream: ResponseStream) -> None:
    """A cancel keeps the item it cut open, ``incomplete`` (ORD-8), when it carries a step's
    training fields (TOK-60); otherwise a cancelled response drops it."""
    stream._abandon_open_item()
