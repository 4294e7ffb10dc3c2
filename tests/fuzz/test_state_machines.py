"""STATE-1..STATE-3, ORD-1..ORD-8: totality of the pure response state machine.

``ResponseMachine`` drives one ``protocol.stream.ResponseStream`` with every builder method in
every state, legal or not. A reference model (the STATE-1 table plus the builder's item rules,
STATE-2) says which calls are legal. Each call must then either

* be legal, emit events, and move the builder to the state the model predicts, or
* raise ``IllegalTransition`` and leave the builder exactly as it was (nothing emitted, no state,
  sequence number, open item or output changed).

Invariants over everything emitted: sequence numbers are 0, 1, 2, … with no gaps; output indices
follow ``output_item.added`` order; item ids and content indices are consistent; the terminal
event is the last; every event survives ``encode`` → msgspec decode into ``ServerEvent`` unchanged
and parses with the openai SDK (CONF-1); an emitted event never changes afterwards.
"""

from __future__ import annotations

import copy
from typing import Any

import msgspec
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)

from protocol import events as ev
from protocol.codec import encode
from protocol.items import FunctionCall
from protocol.response import Response, Usage
from protocol.states import (
    TERMINAL_STATES,
    TRANSITIONS,
    IllegalTransition,
    ResponseState,
    Step,
    next_state,
)
from protocol.stream import ResponseStream
from tests.fuzz._support import examples, report, timeout_for
from tests.support.oracle import sdk_parse

S = ResponseState
DECODER = msgspec.json.Decoder(ev.ServerEvent)
LIVE = (S.CREATED, S.IN_PROGRESS, S.SUSPENDED)

texts = st.text(max_size=12)
names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,15}", fullmatch=True)
call_ids = st.from_regex(r"call_[0-9a-f]{4,24}", fullmatch=True)
reasons = st.sampled_from(["max_output_tokens", "idle_timeout"])
usages = st.builds(
    lambda i, o: Usage(input_tokens=i, output_tokens=o, total_tokens=i + o),
    st.integers(0, 10_000),
    st.integers(0, 10_000),
)


def _fingerprint(stream: ResponseStream) -> Any:
    """Everything an illegal call must leave untouched."""
    opened = stream._open
    open_state = None
    if opened is not None:
        open_state = (type(opened).__name__, opened.item_id, opened.output_index, *opened.pieces)
    return (
        stream.state,
        stream.next_sequence_number,
        open_state,
        encode(stream.response),
    )


class ResponseMachine(RuleBasedStateMachine):
    """One response builder, driven with every method in every state."""

    runs = 0
    raised = 0  # illegal calls that raised IllegalTransition

    def __init__(self) -> None:
        super().__init__()
        type(self).runs += 1
        self.stream_id: str | None = None
        self.stream = ResponseStream(Response(id="resp_fuzz", created_at=1, model="m"))
        # reference model
        self.state = S.NEW
        self.open_kind: str | None = None  # "message" | "call"
        self.step_calls: list[FunctionCall] = []
        # what was emitted
        self.emitted: list[tuple[Any, bytes]] = []
        self.items_added: list[str] = []  # item ids in output_index order
        self.open_item: tuple[str, int] | None = None  # (item_id, output_index)
        self.pieces: list[str] = []
        self.terminal_seen = False

    # ------------------------------------------------------------------ harness
    def _legal(
        self, step: Step | None, needs_open: str | None = None, closed: bool = False
    ) -> bool:
        if step is not None and (self.state, step) not in TRANSITIONS:
            return False
        if needs_open is not None and self.open_kind != needs_open:
            return False
        return not (closed and self.open_kind is not None)

    def _call(self, legal: bool, method: Any, *args: Any) -> Any:
        before = _fingerprint(self.stream)
        if not legal:
            with pytest.raises(IllegalTransition):
                method(*args)
            type(self).raised += 1
            after = _fingerprint(self.stream)
            assert after == before, (
                f"STATE-2: illegal {method.__name__} in {self.state} changed the builder"
            )
            return None
        result = method(*args)
        return result

    def _emit(self, *events: Any) -> None:
        for event in events:
            notice = isinstance(event, ev.InjectCreated)  # not a lifecycle step (STATE-3)
            assert notice or not self.terminal_seen, "STATE-3: an event after the terminal event"
            assert event.sequence_number == len(self.emitted), "ORD-3: sequence numbers"
            assert event.stream_id == self.stream_id, "WS-7"
            raw = encode(event)
            assert DECODER.decode(raw) == event, "codec round trip"
            data = msgspec.json.decode(raw)
            if isinstance(event, ev.ResponseDone):
                from openai.types.responses import Response as SdkResponse

                SdkResponse.model_validate(data["response"])
            else:
                sdk_parse(raw)
            self.emitted.append((event, raw))
            if isinstance(event, ev.ResponseCompleted | ev.ResponseFailed | ev.ResponseIncomplete):
                self.terminal_seen = True

    def _expect_state(self) -> None:
        assert self.stream.state is self.state, (self.stream.state, self.state)
        assert self.stream.has_open_item == (self.open_kind is not None)

    # ------------------------------------------------------------------ lifecycle
    @rule(stream_id=st.sampled_from([None, "lane-1"]))
    def created(self, stream_id: str | None) -> None:
        legal = self._legal(Step.CREATE)
        if legal:
            self.stream.stream_id = self.stream_id = stream_id
        event = self._call(legal, self.stream.created)
        if legal:
            assert isinstance(event, ev.ResponseCreated) and event.response.output == []
            self._emit(event)
            self.state = next_state(self.state, Step.CREATE)

    @rule()
    def in_progress(self) -> None:
        legal = self._legal(Step.START)
        event = self._call(legal, self.stream.in_progress)
        if legal:
            self._emit(event)
            self.state = S.IN_PROGRESS

    @rule()
    def suspend(self) -> None:
        legal = self._legal(Step.SUSPEND, closed=True)
        event = self._call(legal, self.stream.suspend, list(self.step_calls))
        if legal:
            assert isinstance(event, ev.ResponseDone)
            assert [c.call_id for c in event.pending_calls] == [c.call_id for c in self.step_calls]
            assert event.response.status == "in_progress"
            self._emit(event)
            self.state = S.SUSPENDED
            self.step_calls = []

    @rule()
    def resume(self) -> None:
        legal = self._legal(Step.RESUME)
        self._call(legal, self.stream.resume)
        if legal:
            self.state = S.IN_PROGRESS

    @rule()
    def inject_created(self) -> None:
        # A notice like the steering ones: legal in any state after response.created, also after
        # the terminal event (a standard-mode target has completed when it takes its calls'
        # outputs, INJECT-4, STEER-8), and it changes no state.
        legal = self.state is not S.NEW
        event = self._call(legal, self.stream.inject_created)
        if legal:
            assert event.response_id == "resp_fuzz"
            self._emit(event)

    @rule(usage=usages, at=st.integers(0, 2**31))
    def completed(self, usage: Usage, at: int) -> None:
        legal = self._legal(Step.COMPLETE, closed=True)
        event = self._call(legal, self.stream.completed, usage, at)
        if legal:
            self._terminal(event, "completed")

    @rule(usage=st.none() | usages, at=st.integers(0, 2**31))
    def failed(self, usage: Usage | None, at: int) -> None:
        legal = self._legal(Step.FAIL)
        event = self._call(
            legal, self.stream.failed, "server_error", "The model failed.", usage, at
        )
        if legal:
            assert event.response.error.code == "server_error"
            self._terminal(event, "failed")

    @rule(reason=reasons, usage=st.none() | usages, at=st.integers(0, 2**31))
    def incomplete(self, reason: str, usage: Usage | None, at: int) -> None:
        legal = self._legal(Step.INCOMPLETE)
        event = self._call(legal, self.stream.incomplete, reason, usage, at)
        if legal:
            assert event.response.incomplete_details.reason == reason
            self._terminal(event, "incomplete")

    def _terminal(self, event: Any, status: str) -> None:
        response = event.response
        assert response.status == status
        ids = [item.id for item in response.output]
        if self.open_item is not None:  # ORD-8: the open item is kept, incomplete
            assert status != "completed"
            assert ids == [*self.items_added, self.open_item[0]]
            last = response.output[-1]
            assert last.status == "incomplete"
            produced = "".join(self.pieces)
            if isinstance(last, FunctionCall):
                assert last.arguments == produced
            else:
                assert last.content[0].text == produced
        else:
            assert ids == self.items_added, "ORD-7: the terminal output holds every item"
        self._emit(event)
        self.state = {"completed": S.COMPLETED, "failed": S.FAILED, "incomplete": S.INCOMPLETE}[
            status
        ]
        self.open_kind = None
        self.open_item = None

    # ------------------------------------------------------------------ messages
    @rule()
    def add_message(self) -> None:
        legal = self._legal(Step.OUTPUT, closed=True)
        events = self._call(legal, self.stream.add_message)
        if legal:
            added, part = events
            assert isinstance(added, ev.OutputItemAdded) and isinstance(part, ev.ContentPartAdded)
            assert added.output_index == len(self.items_added), "ORD-4"
            assert part.item_id == added.item.id and part.content_index == 0, "ORD-6"
            self._emit(*events)
            self.open_kind, self.open_item, self.pieces = "message", (added.item.id, 0), []
            self.open_item = (added.item.id, added.output_index)

    @rule(delta=texts)
    def text_delta(self, delta: str) -> None:
        legal = self._legal(Step.OUTPUT, needs_open="message")
        event = self._call(legal, self.stream.text_delta, delta)
        if legal:
            self._check_sub_event(event)
            assert event.content_index == 0
            self._emit(event)
            self.pieces.append(delta)

    @rule(status=st.sampled_from(["completed", "incomplete"]))
    def finish_message(self, status: str) -> None:
        legal = self._legal(Step.OUTPUT, needs_open="message")
        events = self._call(legal, self.stream.finish_message, status)
        if legal:
            text_done, part_done, item_done = events
            for event in (text_done, part_done):
                self._check_sub_event(event)
            assert text_done.text == "".join(self.pieces) == part_done.part.text
            assert item_done.item.id == self.open_item[0]
            assert item_done.output_index == self.open_item[1]
            self._emit(*events)
            self._close_item()

    # ------------------------------------------------------------------ function calls
    @rule(name=names, call_id=call_ids)
    def add_function_call(self, name: str, call_id: str) -> None:
        legal = self._legal(Step.OUTPUT, closed=True)
        event = self._call(legal, self.stream.add_function_call, name, call_id)
        if legal:
            assert event.output_index == len(self.items_added), "ORD-4"
            assert event.item.call_id == call_id and event.item.arguments == ""
            self._emit(event)
            self.open_kind, self.pieces = "call", []
            self.open_item = (event.item.id, event.output_index)

    @rule(delta=texts)
    def arguments_delta(self, delta: str) -> None:
        legal = self._legal(Step.OUTPUT, needs_open="call")
        event = self._call(legal, self.stream.arguments_delta, delta)
        if legal:
            self._check_sub_event(event)
            self._emit(event)
            self.pieces.append(delta)

    @rule()
    def finish_function_call(self) -> None:
        legal = self._legal(Step.OUTPUT, needs_open="call")
        result = self._call(legal, self.stream.finish_function_call)
        if legal:
            call, events = result
            args_done, item_done = events
            self._check_sub_event(args_done)
            assert args_done.arguments == call.arguments == "".join(self.pieces)
            assert item_done.item == call and call.id == self.open_item[0]
            self._emit(*events)
            self.step_calls.append(call)
            self._close_item()

    def _check_sub_event(self, event: Any) -> None:
        assert self.open_item is not None
        assert event.item_id == self.open_item[0], "ORD-6: item_id"
        assert event.output_index == self.open_item[1], "ORD-4: output_index"

    def _close_item(self) -> None:
        assert self.open_item is not None
        self.items_added.append(self.open_item[0])
        self.open_kind, self.open_item, self.pieces = None, None, []

    # ------------------------------------------------------------------ invariants
    @invariant()
    def builder_matches_model(self) -> None:
        self._expect_state()
        assert self.stream.next_sequence_number == len(self.emitted)
        if self.state in TERMINAL_STATES:
            assert self.terminal_seen

    @invariant()
    def emitted_events_never_change(self) -> None:
        if self.emitted:
            for event, raw in self.emitted[-3:]:
                assert encode(event) == raw, "an emitted event was mutated afterwards"

    def teardown(self) -> None:
        for event, raw in self.emitted:
            assert encode(event) == raw, "an emitted event was mutated afterwards"
        seqs = [event.sequence_number for event, _ in self.emitted]
        assert seqs == list(range(len(seqs)))
        added = [e.output_index for e, _ in self.emitted if isinstance(e, ev.OutputItemAdded)]
        assert added == list(range(len(added))), "ORD-4: indices in added order, never reused"
        if self.terminal_seen:  # the last lifecycle event is terminal; notices may follow it
            lifecycle = [e for e, _ in self.emitted if not isinstance(e, ev.InjectCreated)]
            assert lifecycle[-1].response.status in ("completed", "failed", "incomplete")


@pytest.mark.timeout(timeout_for(60))
def test_response_stream_is_total() -> None:
    machine = type("Machine", (ResponseMachine,), {"runs": 0, "raised": 0})
    run_state_machine_as_test(
        machine,
        settings=settings(max_examples=examples(ci=1.0, deep=1.0), stateful_step_count=40),
    )
    report("ResponseMachine", machine.runs, {"illegal calls refused": machine.raised})


def test_transition_table_is_total_and_closed() -> None:
    """Every (state, step) pair: a documented state or ``IllegalTransition``; terminals absorb."""
    for state in ResponseState:
        for step in Step:
            if (state, step) in TRANSITIONS:
                assert isinstance(next_state(state, step), ResponseState)
            else:
                with pytest.raises(IllegalTransition):
                    next_state(state, step)
            if state in TERMINAL_STATES:
                assert (state, step) not in TRANSITIONS
    # every live state can still end, and CREATE is the only way out of NEW
    for state in LIVE:
        assert (state, Step.FAIL) in TRANSITIONS and (state, Step.INCOMPLETE) in TRANSITIONS
    assert [s for s in Step if (S.NEW, s) in TRANSITIONS] == [Step.CREATE]


def test_snapshots_are_copies() -> None:
    """A lifecycle event's Response does not change when the builder moves on."""
    stream = ResponseStream(Response(id="resp_x", created_at=1, model="m"))
    created = stream.created()
    before = copy.deepcopy(encode(created))
    stream.in_progress()
    stream.add_message()
    stream.text_delta("hi")
    stream.finish_message()
    stream.completed(Usage(input_tokens=1, output_tokens=1, total_tokens=2), 2)
    assert encode(created) == before
