"""A hypothesis state machine driving a real server over WebSocket on loopback.

``WsProtocolMachine`` interleaves, on one connection at a time (with reconnects): stateless
creates (text, tool calls, several lanes), continuations of the current, a stale, another lane's,
an evicted, a stored or an unknown ``previous_response_id`` with right and wrong tool outputs,
warmups, append-mode rollouts with right / partial / wrong / duplicate / late appends and
injects, bursts of creates queued on lanes (also behind a suspended append rollout, up to the
queue limit), malformed frames (invalid JSON and UTF-8, binary, non-objects, missing or unknown
``type``, wrong field types, ~1 MB strings, deep nesting), steering, disconnects in the middle
of a stream and reconnects.

It keeps a model of what the server must do: each lane's cached latest response (CACHE-1..3:
only the lane's latest is served from the cache; a failed continuation evicts it), the store
(STORE-1/2: ``store: true`` responses stay continuable after eviction and reconnects), the live
append-mode rollouts and their pending calls (APPEND-*), the lane queues (WS-5/WS-6). Every frame
goes through ``StreamChecker`` (ORD-*, ERR-*, WS-7), every request's outcome is predicted and
compared, and after each connection the server's task count must return to its baseline (WS-12).
"""

from __future__ import annotations

import json
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    precondition,
    rule,
    run_state_machine_as_test,
)

from engine.core import EngineConfig
from engine.models.router import Router, simulator_router
from engine.models.sim import SimulatedModel
from protocol.events import CLIENT_EVENT_TYPES, TERMINAL_TYPES
from tests.fuzz._support import (
    _INTERNAL,
    LiveEnv,
    Note,
    StreamChecker,
    Tracked,
    WsConn,
    examples,
    report,
    timeout_for,
    validate_recorded,
)

T = TypeVar("T")
MAX_QUEUED = 3  # a small lane queue so that the fuzzer reaches websocket_queue_full (WS-6)
LANES: list[str | None] = [None, "a", "b.2-x"]
APPEND_BETA = {"OpenAI-Beta": "rollout-append=v1"}
# Steering rules (STEER-*) run on a lane of their own, and a paced simulator lets a steer land
# while a response streams (the other routes run at full speed: tokens_per_second=0).
STEER_LANE = "steer.x"
SLOW_MODEL = "sim-paced"
SLOW_TPS = 500.0

TOOL_DEFS: dict[str, dict[str, Any]] = {
    "get_weather": {
        "type": "function",
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
    "lookup": {
        "type": "function",
        "name": "lookup",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
        },
    },
    "noop": {"type": "function", "name": "noop"},
}
TOOL_NAMES = list(TOOL_DEFS)
VOCAB = ["what", "is", "the", "Paris", "Tokyo", "please", "check", "and", "then", "say", "hi"]

# ----------------------------------------------------------------------------- strategies

cjk = st.text(st.characters(min_codepoint=0x3040, max_codepoint=0x9FFF), max_size=6)
emoji = st.text(st.characters(min_codepoint=0x1F300, max_codepoint=0x1F64F), max_size=3)
user_texts = st.builds(
    lambda words, extra: " ".join(words) + extra,
    st.lists(st.sampled_from(VOCAB + TOOL_NAMES), min_size=1, max_size=6),
    st.one_of(st.just(""), cjk, emoji),
)
tool_sets = st.lists(st.sampled_from(TOOL_NAMES), unique=True, max_size=3)
output_texts = st.one_of(
    st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40),
    st.sampled_from(["sunny", "42", "", "ok\nline two", "ünïcødé ✓ 雨"]),
)
tool_choices = st.sampled_from(["auto", "auto", "required", "none", "function"])
# in append mode a forced choice never finishes the rollout (a call after every resume)
append_tool_choices = st.sampled_from(["auto"] * 5 + ["required", "function", "none"])
message_forms = st.sampled_from(["string", "easy", "typed", "parts"])
stores = st.booleans()
small_budgets = st.sampled_from([None] * 8 + [1, 4])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=6,
)
steer_texts = st.lists(st.sampled_from(VOCAB), min_size=1, max_size=5).map(" ".join)
safe_text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=70).filter(
    lambda s: not _INTERNAL.search(s)
)

# (field, bad value, expected code, expected param): CODEC-3 over response.create
WRONG_FIELDS: list[tuple[str, Any, str, str | None]] = [
    ("model", 1, "invalid_type", "model"),
    ("input", 5, "invalid_type", "input"),
    ("input", {"a": 1}, "invalid_type", "input"),
    ("store", "yes", "invalid_type", "store"),
    ("temperature", "hot", "invalid_type", "temperature"),
    ("tools", "x", "invalid_type", "tools"),
    ("tools", [{"type": "no_such_tool"}], "invalid_value", "tools[0].type"),
    ("tools", [{"type": "function"}], "missing_required_parameter", "tools[0].name"),
    ("tool_choice", "sometimes", "invalid_value", "tool_choice"),
    ("tool_choice", {"type": "function"}, "missing_required_parameter", "tool_choice.name"),
    ("rollout_mode", "turbo", "invalid_value", "rollout_mode"),
    ("stream_id", 5, "invalid_type", "stream_id"),
    ("generate", "no", "invalid_type", "generate"),
    ("max_output_tokens", "10", "invalid_type", "max_output_tokens"),
    ("previous_response_id", 7, "invalid_type", "previous_response_id"),
    ("parallel_tool_calls", None, "invalid_type", "parallel_tool_calls"),
    ("reasoning", {"effort": 5}, "invalid_type", "reasoning.effort"),
]
# (input items, code, param) rejected while the create is admitted or prepared (CODEC-4, VAL-*)
BAD_INPUTS: list[tuple[list[Any], str, str]] = [
    ([{"type": "bogus"}], "invalid_value", "input[{i}].type"),
    ([{"role": "user"}], "missing_required_parameter", "input[{i}].content"),
    ([{"type": "message", "role": "robot", "content": "x"}], "invalid_value", "input[{i}].role"),
    ([{"type": "function_call_output", "output": "x"}], "missing_required_parameter",
     "input[{i}].call_id"),
    ([{"type": "message", "role": "user", "content": [{"type": "bogus_part"}]}],
     "invalid_value", "input[{i}].content[0].type"),
]  # fmt: skip
ADMISSION_CODES = {"invalid_value", "missing_required_parameter", "invalid_type"}
BAD_STREAM_IDS = ["", "bad lane!", "lane/1", "ü-lane", "x" * 257]

# ----------------------------------------------------------------------------- the model


@dataclass
class Cached:
    """A lane's cached latest response (CACHE-1) or a stored record: its unanswered calls."""

    rid: str
    pending: list[str]


@dataclass
class Outcome:
    """What a create must do once its lane runs it."""

    error: tuple[str, str | None] | None = None
    evict: bool = False
    warm: bool = False
    append: bool = False
    calls: list[str] | None = None  # tool names of the first step; None: a text answer
    text_prefix: str | None = None
    budget: bool = False  # max_output_tokens set: may end incomplete
    forced_tool: str | None = None  # append: each resume calls this tool again


@dataclass
class Create:
    lane: str | None
    body: dict[str, Any]
    fault: tuple[str, str] | None = None  # expected admission/preparation error (code, param)
    fault_stage: str = ""  # "admit" | "prepare"
    rid: str | None = None
    outcome: Outcome | None = None


ErrorShape = tuple[str, str | None, str | None]  # (code, param, stream_id) of an error event


@dataclass
class Immediate:
    """An answer that comes straight from the frame handler (not through a lane queue)."""

    kind: str  # "error" | "response.inject.created" | "response.inject.failed" | steer
    codes: set[str] = field(default_factory=set)
    param: str | bool | None = False  # False: not checked
    stream_id: str | None = None
    response_id: str | None = None
    status: int | None = None
    not_echoed: str | None = None
    # An error that may take one of several exact shapes (``codes``, ``param`` and
    # ``stream_id`` are then unused). Only an error of one of these shapes is this answer.
    shapes: frozenset[ErrorShape] | None = None

    def is_answered_by(self, code: str, param: str | None, stream_id: str | None) -> bool:
        """Whether an ``error`` event is this answer. Without ``shapes``, ``param`` is asserted
        after the match (a wrong param is then reported as such)."""
        if self.kind != "error":
            return False
        if self.shapes is not None:
            return (code, param, stream_id) in self.shapes
        return code in self.codes and self.stream_id == stream_id


@dataclass
class AppendLive:
    rid: str
    lane: str | None
    tools: list[str]
    forced_tool: str | None
    store: bool
    pending: list[str]
    names: dict[str, str] = field(default_factory=dict)
    answered: set[str] = field(default_factory=set)


@dataclass
class LaneModel:
    latest: Cached | None = None
    queue: deque[Create] = field(default_factory=deque)
    busy: str | None = None  # a suspended append-mode response occupying the lane
    history: list[str] = field(default_factory=list)

    def waiting(self) -> int:
        return sum(1 for c in self.queue if c.rid is None)


def last_kind(items: list[dict[str, Any]]) -> str:
    """What the simulator looks at (SIM-3): "user", "output" or "other" (assistant, reasoning)."""
    last = items[-1]
    kind = last.get("type", "message")
    if kind == "function_call_output":
        return "output"
    if kind == "message" and last.get("role") in ("user", "developer", "system"):
        return "user"
    return "other"


def _resolve_references(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """ITEM-4 within one request: an item_reference stands for the item with that id."""
    by_id = {i["id"]: i for i in items if i.get("id") and i.get("type") != "item_reference"}
    return [by_id.get(i["id"], i) if i.get("type") == "item_reference" else i for i in items]


def expected_calls(
    text: str, tools: list[str], choice: Any, parallel: bool, last: str
) -> list[str] | None:
    """The simulator's policy (SIM-3) for the first sampling step; ``last`` is the kind of
    the context's last item (see ``last_kind``)."""
    usable = [] if choice == "none" else list(tools)
    forced = choice == "required" or isinstance(choice, dict)
    if isinstance(choice, dict):
        usable = [t for t in usable if t == choice["name"]] or usable
    if not usable:
        return None
    if last == "output":
        return usable[:1] if forced else None
    if last != "user":
        return None
    named = [t for t in usable if t.lower() in text.lower()] or usable[:1]
    return named if parallel else named[:1]


def forced_tool(tools: list[str], choice: Any) -> str | None:
    """In append mode a forced tool_choice calls the tool again after every resume."""
    if choice == "required" and tools:
        return tools[0]
    if isinstance(choice, dict) and tools:
        return choice["name"] if choice["name"] in tools else tools[0]
    return None


def message(text: str, form: str) -> Any:
    if form == "easy":
        return {"role": "user", "content": text}
    if form == "typed":
        return {"type": "message", "role": "user", "content": text}
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def tool_output(call_id: str, text: str, as_parts: bool = False) -> dict[str, Any]:
    output: Any = [{"type": "input_text", "text": text}] if as_parts else text
    return {"type": "function_call_output", "call_id": call_id, "output": output}


# ----------------------------------------------------------------------------- the machine


class WsProtocolMachine(RuleBasedStateMachine):
    env: LiveEnv  # set by the test function
    runs = 0
    tally: Counter[str]  # what the runs covered (printed by the test)

    def __init__(self) -> None:
        super().__init__()
        type(self).runs += 1
        self.recorded_start = len(_recorded())
        self.baseline = self.env.task_count()
        self.store: dict[str, Cached] = {}
        self.known_ids: list[str] = []  # every response id seen in this run
        self.standard_ids: list[str] = []
        self.broken = False
        self.conn: WsConn | None = None
        self._connect(header=False)

    # ================================================================== connection
    def _connect(self, header: bool) -> None:
        self.header_append = header
        self.conn = self.env.run(WsConn.open(self.env, APPEND_BETA if header else None))
        self.checker = StreamChecker()
        self.lanes: dict[str | None, LaneModel] = {lane: LaneModel() for lane in LANES}
        self.immediate: deque[Immediate] = deque()
        self.appends: dict[str, AppendLive] = {}
        self.resumed: set[str] = set()
        self.finished_appends: list[str] = []

    def _disconnect(self) -> None:
        """Close the socket and check the server released everything it owned (WS-12)."""
        assert self.conn is not None
        self.env.run(self.conn.close())
        self.conn = None
        self._check_released()

    def _check_released(self) -> None:
        count = self.env.run(self.env.settle_tasks(self.baseline))
        assert count <= self.baseline, f"WS-12: {count} tasks after close, baseline {self.baseline}"
        assert self.env.run(self.env.open_sessions()) == 0, "WS-12: session not released"

    # ================================================================== I/O helpers
    def _send(self, event: Any) -> None:
        assert self.conn is not None
        self._run(self.conn.send(event))

    def _settle(self) -> None:
        """Read events until every outstanding request has reached its predicted end."""
        self._run(self._settle_async(), timeout=60)

    def _run(self, coro: Any, timeout: float = 30.0) -> Any:
        try:
            return self.env.run(coro, timeout)
        except BaseException:
            self.broken = True  # teardown then only cleans up
            raise

    async def _settle_async(self) -> None:
        assert self.conn is not None
        while self._outstanding():
            event = await self.conn.recv()
            self._on_event(event)

    def _outstanding(self) -> bool:
        if self.immediate or self.resumed:
            return True
        return any(lane.queue and lane.busy is None for lane in self.lanes.values())

    def _barrier(self) -> None:
        """Prove that nothing else is on the wire: an unknown event type must be answered
        next, with nothing before it."""
        self.immediate.append(Immediate("error", {"unknown_event_type"}, param="type"))
        self._send({"type": "fuzz.barrier"})
        self._settle()

    # ================================================================== event dispatch
    def _on_event(self, event: dict[str, Any]) -> None:
        note = self.checker.feed(event)
        kind = note.kind
        if kind == "error":
            self.tally[f"error {event['error']['code']}"] += 1
        elif kind in ("terminal", "notice", "suspended"):
            self.tally[event["type"]] += 1
        if kind == "error":
            self._on_error(event)
        elif kind == "created":
            self._on_created(note)
        elif kind == "suspended":
            self._on_suspended(note)
        elif kind == "terminal":
            self._on_terminal(note)
        elif kind == "notice":
            self._on_notice(event)
        elif kind == "output":
            tracked = note.response
            assert tracked is not None
            for pending in self.immediate:  # APPEND-4: the ack precedes the resumed step
                assert pending.response_id != tracked.id, "inject ack after the resumed step"

    def _on_error(self, event: dict[str, Any]) -> None:
        code, param = event["error"]["code"], event["error"]["param"]
        stream_id = event.get("stream_id")
        if self.immediate and self.immediate[0].is_answered_by(code, param, stream_id):
            expected = self.immediate.popleft()
            if expected.param is not False:
                assert param == expected.param, (code, param, expected.param)
            if expected.status is not None:
                assert event["status"] == expected.status, event
            if expected.not_echoed:
                assert expected.not_echoed not in event["error"]["message"], "echoed"
            return
        lane = self.lanes.get(stream_id)
        if lane is not None and lane.queue and lane.queue[0].rid is None and lane.busy is None:
            create = lane.queue.popleft()
            outcome = self._predict(create, lane)
            assert outcome.error is not None, (
                f"create {create.body} was rejected with {code} ({param}); expected it to run"
            )
            assert (code, param) == outcome.error, (
                f"create {create.body}: got {code} ({param}), expected {outcome.error}"
            )
            assert event["status"] == 400
            prev = create.body.get("previous_response_id")
            if outcome.evict and lane.latest is not None and lane.latest.rid == prev:
                lane.latest = None  # CACHE-3: a failed continuation evicts its parent
            return
        raise AssertionError(f"unexpected error event {event}; waiting for {self.immediate}")

    def _on_created(self, note: Note) -> None:
        tracked = note.response
        assert tracked is not None
        lane = self.lanes[tracked.lane]
        assert lane.queue and lane.queue[0].rid is None, f"unexpected response on {tracked.lane}"
        create = lane.queue[0]
        outcome = self._predict(create, lane)
        assert outcome.error is None, f"create {create.body} ran; expected error {outcome.error}"
        create.rid, create.outcome = tracked.id, outcome
        self.known_ids.append(tracked.id)
        response = note.event["response"]
        body = create.body
        assert response["previous_response_id"] == body.get("previous_response_id"), "RESP-2"
        assert response["store"] == body.get("store", True), "RESP-2"
        assert response["model"] == body.get("model", "sim"), "RESP-2"
        assert [t["name"] for t in response["tools"]] == [t["name"] for t in body.get("tools", [])]
        if not outcome.append:
            self.standard_ids.append(tracked.id)

    def _head(self, tracked: Tracked) -> Create | None:
        lane = self.lanes[tracked.lane]
        if lane.queue and lane.queue[0].rid == tracked.id:
            return lane.queue[0]
        return None

    def _on_suspended(self, note: Note) -> None:
        tracked = note.response
        assert tracked is not None
        pending = [(c["call_id"], c["name"]) for c in note.event["pending_calls"]]
        create = self._head(tracked)
        if create is not None:  # the first suspension of a new append-mode rollout
            outcome = create.outcome
            assert outcome is not None and outcome.append, "response.done in standard mode"
            if not outcome.budget:
                assert [name for _, name in pending] == outcome.calls, (pending, outcome)
            self.lanes[tracked.lane].queue.popleft()
            self.lanes[tracked.lane].busy = tracked.id
            self.appends[tracked.id] = AppendLive(
                rid=tracked.id,
                lane=tracked.lane,
                tools=[t["name"] for t in create.body.get("tools", [])],
                forced_tool=outcome.forced_tool,
                store=create.body.get("store", True),
                pending=[cid for cid, _ in pending],
                names=dict(pending),
            )
            return
        live = self.appends.get(tracked.id)
        assert live is not None and tracked.id in self.resumed, "a suspension nobody resumed"
        self.resumed.discard(tracked.id)
        assert live.forced_tool is not None, "suspended again without a forced tool_choice"
        assert [name for _, name in pending] == [live.forced_tool], pending
        live.pending = [cid for cid, _ in pending]
        live.names.update(pending)

    def _on_terminal(self, note: Note) -> None:
        tracked = note.response
        assert tracked is not None and tracked.final is not None
        final = tracked.final
        lane = self.lanes[tracked.lane]
        create = self._head(tracked)
        answered: set[str] = set()
        store = True
        if create is not None:
            lane.queue.popleft()
            outcome = create.outcome
            assert outcome is not None
            self._check_shape(create, outcome, tracked, final)
            store = create.body.get("store", True)
        else:
            live = self.appends.pop(tracked.id, None)
            assert live is not None and tracked.id in self.resumed, f"stray terminal {tracked.id}"
            self.resumed.discard(tracked.id)
            assert lane.busy == tracked.id
            lane.busy = None
            answered, store = live.answered, live.store
            if final["status"] == "completed":
                assert live.forced_tool is None
                text = final["output"][-1]["content"][0]["text"]
                assert text.startswith("Based on the tool results: "), text
        if tracked.suspensions or (create is not None and create.outcome and create.outcome.append):
            self.finished_appends.append(tracked.id)
        if final["status"] in ("completed", "incomplete"):
            pending = [
                item["call_id"]
                for item in final["output"]
                if item["type"] == "function_call"
                and item["status"] == "completed"
                and item["call_id"] not in answered
            ]
            entry = Cached(tracked.id, pending)
            lane.latest = entry  # CACHE-1: the lane's latest
            lane.history.append(tracked.id)
            if store:
                self.store[tracked.id] = entry

    def _check_shape(
        self, create: Create, outcome: Outcome, tracked: Tracked, final: dict[str, Any]
    ) -> None:
        status = final["status"]
        if outcome.warm:  # WS-9: created then completed, nothing else
            assert tracked.events == 2 and status == "completed" and final["output"] == []
            assert final["usage"]["output_tokens"] == 0
            return
        if outcome.budget and status == "incomplete":
            assert final["incomplete_details"]["reason"] == "max_output_tokens"
            return
        assert status == "completed", final["status"]
        if outcome.append and outcome.calls is not None:
            raise AssertionError("an append rollout with calls ended without suspending")
        names = [o["name"] for o in final["output"] if o["type"] == "function_call"]
        if outcome.calls is not None:
            assert names == outcome.calls, (names, outcome.calls, create.body)
            assert len(final["output"]) == len(names)
        else:
            assert names == [] and len(final["output"]) == 1, final["output"]
            text = final["output"][0]["content"][0]["text"]
            assert outcome.text_prefix is not None and text.startswith(outcome.text_prefix), text

    def _on_notice(self, event: dict[str, Any]) -> None:
        assert self.immediate, f"unexpected notice {event}"
        expected = self.immediate.popleft()
        assert event["type"] == expected.kind, (event, expected)
        if expected.response_id is not None:
            assert event["response_id"] == expected.response_id
        if expected.codes:
            assert event["error"]["code"] in expected.codes, event
        if event["type"] == "response.inject.created":
            assert event.get("stream_id") == expected.stream_id, "WS-7"

    # ================================================================== prediction
    def _find(self, rid: str, lane: LaneModel) -> Cached | None:
        """Where a continuation finds its parent (COMPAT-2..4): this lane's latest, another
        lane's latest (a fork), or the store."""
        if lane.latest is not None and lane.latest.rid == rid:
            return lane.latest
        for other in self.lanes.values():
            if other.latest is not None and other.latest.rid == rid:
                return other.latest
        return self.store.get(rid)

    def _predict(self, create: Create, lane: LaneModel) -> Outcome:
        body = create.body
        prev = body.get("previous_response_id")
        if create.fault_stage == "admit":
            assert create.fault is not None
            return Outcome(error=create.fault, evict=True)  # CACHE-3: admission errors evict
        parent: Cached | None = None
        if prev is not None:
            parent = self._find(prev, lane)
            if parent is None:
                return Outcome(error=("previous_response_not_found", "previous_response_id"))
        if create.fault_stage == "prepare":
            assert create.fault is not None
            return Outcome(error=create.fault, evict=True)
        items = body.get("input", [])
        if isinstance(items, str):
            items = [message(items, "typed")]
        items = _resolve_references(items)
        known = set(parent.pending if parent is not None else [])
        answered: set[str] = set()
        for index, item in enumerate(items):  # VAL-1, VAL-2 in input order
            kind = item.get("type", "message")
            if kind == "function_call":
                known.add(item["call_id"])
            elif kind == "function_call_output":
                param = f"input[{index}].call_id"
                if item["call_id"] not in known:
                    return Outcome(error=("unknown_call_id", param), evict=True)
                if item["call_id"] in answered:
                    return Outcome(error=("duplicate_tool_output", param), evict=True)
                answered.add(item["call_id"])
        if known - answered:  # VAL-5
            return Outcome(error=("tool_output_missing", "input"), evict=True)
        mode_append = body.get("rollout_mode") == "append" or (
            self.header_append and "rollout_mode" not in body
        )
        outcome = Outcome(append=mode_append, budget=body.get("max_output_tokens") is not None)
        if body.get("generate") is False:
            outcome.warm = True
            return outcome
        tools = [t["name"] for t in body.get("tools", [])]
        choice = body.get("tool_choice", "auto")
        last = last_kind(items)
        outcome.calls = expected_calls(
            _text_of(items[-1]), tools, choice, body.get("parallel_tool_calls", True), last
        )
        outcome.text_prefix = (
            "Based on the tool results: " if last == "output" else "This is a simulated answer to: "
        )
        if mode_append:
            usable = [] if choice == "none" else tools
            outcome.forced_tool = forced_tool(usable, choice)
        return outcome

    # ================================================================== create helpers
    def _body(
        self,
        data: st.DataObject,
        lane: str | None,
        items: list[Any] | str,
        *,
        tools: list[str] | None = None,
        mode: str | None = None,
        choices: st.SearchStrategy[str] = tool_choices,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"type": "response.create", "input": items}
        if lane is not None:
            body["stream_id"] = lane
        if tools is None:
            tools = data.draw(tool_sets, label="tools")
        if tools:
            body["tools"] = [TOOL_DEFS[name] for name in tools]
            choice = data.draw(choices, label="tool_choice")
            if choice == "function":
                body["tool_choice"] = {"type": "function", "name": tools[-1]}
            elif choice != "auto":
                body["tool_choice"] = choice
            if data.draw(st.booleans(), label="serial"):
                body["parallel_tool_calls"] = False
        if not data.draw(stores, label="store"):
            body["store"] = False
        budget = data.draw(small_budgets, label="max_output_tokens")
        if budget is not None:
            body["max_output_tokens"] = budget
        if mode is not None:
            body["rollout_mode"] = mode
        extras = data.draw(st.sampled_from(["none", "none", "model", "instructions", "stream"]))
        if extras == "model":
            body["model"] = data.draw(st.sampled_from(["sim", "gpt-fuzz", "ü-model"]))
        elif extras == "instructions":
            body["instructions"] = data.draw(safe_text)
        elif extras == "stream":
            body["stream"] = True  # WS-10: accepted and ignored
            body["unknown_field"] = {"x": [1]}  # LEN-1
        return body

    def _free_lane(self, data: st.DataObject, lane: str | None) -> str | None:
        """Mostly avoid lanes blocked behind a suspended append rollout (creates there only
        queue, and soon overflow), so that the rest of the protocol gets exercised too."""
        free = [name for name in LANES if self.lanes[name].busy is None]
        keep = data.draw(st.integers(0, 4), label="keep busy lane") == 0
        if self.lanes[lane].busy is None or keep or not free:
            return lane
        return free[0]

    def _submit(self, create: Create, *, settle: bool = True) -> None:
        """Send a create; if its lane's queue is full, expect 429 right away (WS-6)."""
        lane = self.lanes[create.lane]
        full = lane.busy is not None and lane.waiting() >= MAX_QUEUED
        if full:
            self.immediate.append(
                Immediate("error", {"websocket_queue_full"}, stream_id=create.lane, status=429)
            )
        else:
            lane.queue.append(create)
        self._send(create.body)
        if settle:
            self._settle()

    # ================================================================== rules: creates
    @rule(
        data=st.data(),
        lane=st.sampled_from(LANES),
        text=user_texts,
        form=message_forms,
        mode=st.sampled_from([None, None, "append", "standard"]),
    )
    def create_stateless(
        self, data: st.DataObject, lane: str | None, text: str, form: str, mode: str | None
    ) -> None:
        self.tally["rule create_stateless"] += 1
        lane = self._free_lane(data, lane)
        items: Any = text if form == "string" else [message(text, form)]
        self._submit(Create(lane, self._body(data, lane, items, mode=mode)))

    @rule(
        data=st.data(),
        lane=st.sampled_from(LANES),
        text=user_texts,
        shape=st.sampled_from(
            ["pair", "pair", "reference", "reasoning", "assistant_last", "unanswered",
             "dup_output", "orphan_output", "unknown_reference", "image"]
        ),
    )  # fmt: skip
    def create_history(self, data: st.DataObject, lane: str | None, text: str, shape: str) -> None:
        """A stateless create that carries a history (the Agents SDK's full resend): replayed
        calls and outputs, item_reference (ITEM-4), reasoning (ITEM-5), images (VAL-3)."""
        self.tally["rule create_history"] += 1
        self.tally[f"history {shape}"] += 1
        lane = self._free_lane(data, lane)
        user: dict[str, Any] = {"type": "message", "role": "user", "content": text, "id": "msg_u1"}
        call = {
            "type": "function_call",
            "call_id": "call_h1",
            "name": "lookup",
            "arguments": '{"query":"x"}',
            "id": "fc_h1",
            "status": "completed",
        }
        output = tool_output("call_h1", data.draw(output_texts))
        items: list[Any] = {
            "pair": [user, call, output],
            "reference": [user, call, output, {"type": "item_reference", "id": "msg_u1"}],
            "reasoning": [
                user,
                {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text",
                                                                  "text": "thinking"}],
                 "encrypted_content": "opaque"},
            ],
            "assistant_last": [user, {"role": "assistant", "content": "an earlier answer"}],
            "unanswered": [user, call],
            "dup_output": [user, call, output, output],
            "orphan_output": [user, output],
            "unknown_reference": [user, {"type": "item_reference", "id": "msg_nope"}],
            "image": [{"role": "user", "content": [
                {"type": "input_text", "text": text},
                {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}]}],
        }[shape]  # fmt: skip
        fault: tuple[str, str] | None = None
        if shape == "unknown_reference":
            fault = ("item_not_found", "input[1].id")
        body = self._body(data, lane, items)
        self._submit(Create(lane, body, fault=fault, fault_stage="prepare" if fault else ""))

    @rule(data=st.data(), lane=st.sampled_from(LANES), text=user_texts)
    def warmup(self, data: st.DataObject, lane: str | None, text: str) -> None:
        """WS-9: generate=false, stateless or continuing a response without pending calls."""
        self.tally["rule warmup"] += 1
        lane = self._free_lane(data, lane)
        items: list[Any] = [message(text, "easy")]
        body = self._body(data, lane, items, tools=[])
        body["generate"] = False
        body.pop("max_output_tokens", None)
        choices = [c.rid for c in self._continuable() if not c.pending]
        if data.draw(st.booleans(), label="continue") and choices:
            body["previous_response_id"] = pick(data, choices)
        self._submit(Create(lane, body))

    def _continuable(self) -> list[Cached]:
        found = [lane.latest for lane in self.lanes.values() if lane.latest is not None]
        return found + list(self.store.values())

    @precondition(lambda self: self.known_ids)
    @rule(
        data=st.data(),
        lane=st.sampled_from(LANES),
        parent_kind=st.sampled_from(["current", "current", "other_lane", "stale", "stored", "any"]),
        variant=st.sampled_from(
            ["answer", "answer", "answer_user", "missing", "wrong_id", "duplicate", "bad_item",
             "background", "unsupported", "unknown_ref"]
        ),
        mode=st.sampled_from([None, None, None, "append"]),
    )  # fmt: skip
    def continue_response(
        self,
        data: st.DataObject,
        lane: str | None,
        parent_kind: str,
        variant: str,
        mode: str | None,
    ) -> None:
        """A continuation with previous_response_id: current / other lane's / stale / stored /
        evicted / unknown ids, right or wrong tool outputs (COMPAT-2..4, CACHE-2/3, VAL-*)."""
        self.tally["rule continue_response"] += 1
        self.tally[f"continue {parent_kind} {variant}"] += 1
        lane = self._free_lane(data, lane)
        model = self.lanes[lane]
        parent: Cached | None = None
        if parent_kind == "current":
            parent = model.latest
        elif parent_kind == "other_lane":
            others = [m.latest for n, m in self.lanes.items() if n != lane and m.latest]
            parent = pick(data, others) if others else None
        elif parent_kind == "stale" and model.history:
            rid = pick(data, model.history)
            parent = self._find(rid, model) or Cached(rid, [])
        elif parent_kind == "stored" and self.store:
            parent = self.store[pick(data, list(self.store))]
        if parent is None:  # any id seen in this run, or one the server never issued
            rid = pick(data, [*self.known_ids, "resp_" + "0" * 32])
            parent = self._find(rid, model) or Cached(rid, [])
        pending = list(parent.pending)
        outputs = _outputs(data, pending)
        items: list[Any] = list(outputs)
        if variant == "answer_user" or not pending:
            form = data.draw(message_forms.filter(lambda f: f != "string"))
            items.append(message(data.draw(user_texts), form))
        fault: tuple[str, str] | None = None
        stage = ""
        if variant == "missing" and pending:
            items = items[1:]  # VAL-5: tool_output_missing
        elif variant == "wrong_id":
            items.append(tool_output("call_" + "f" * 24, "x"))  # VAL-1: unknown_call_id
        elif variant == "duplicate" and outputs:
            items.append(outputs[0])  # VAL-2: duplicate_tool_output
        elif variant == "bad_item":  # CODEC-4: rejected while admitted, before the lookup
            bad, code, param = data.draw(st.sampled_from(BAD_INPUTS))
            fault, stage = (code, param.format(i=len(items))), "admit"
            items += bad
        elif variant == "unsupported":  # VAL-3: the simulator reads no files
            items.append({"role": "user", "content": [{"type": "input_file", "file_data": "eA=="}]})
            fault, stage = (
                ("unsupported_content", f"input[{len(items) - 1}].content[0].type"),
                ("prepare"),
            )
        elif variant == "unknown_ref":  # ITEM-4
            items.append({"type": "item_reference", "id": "msg_" + "0" * 32})
            fault, stage = ("item_not_found", f"input[{len(items) - 1}].id"), "prepare"
        body = self._body(data, lane, items, mode=mode)
        body["previous_response_id"] = parent.rid
        if variant == "background":  # LEN-3: unsupported_parameter, before the lookup
            body["background"] = True
            fault, stage = ("unsupported_parameter", "background"), "admit"
        self._submit(Create(lane, body, fault=fault, fault_stage=stage))

    @rule(
        data=st.data(),
        lane=st.sampled_from(LANES),
        text=user_texts,
        tools=st.lists(st.sampled_from(TOOL_NAMES), unique=True, min_size=1, max_size=3),
        turns=st.integers(1, 3),
    )
    def tool_round_trip(
        self, data: st.DataObject, lane: str | None, text: str, tools: list[str], turns: int
    ) -> None:
        """Standard mode: a create that ends in tool calls, then continuations that answer them
        with previous_response_id (the compat fast path, COMPAT-2)."""
        self.tally["rule tool_round_trip"] += 1
        lane = self._free_lane(data, lane)
        body = self._body(data, lane, [message(text, "easy")], tools=tools, mode="standard")
        body.pop("max_output_tokens", None)
        self._submit(Create(lane, body))
        for _ in range(turns):
            latest = self.lanes[lane].latest
            if latest is None or not latest.pending or self.lanes[lane].busy is not None:
                return
            items: list[Any] = _outputs(data, latest.pending)
            if data.draw(st.booleans(), label="then a user message"):
                items.append(message(data.draw(user_texts), "easy"))
            body = self._body(data, lane, items, tools=tools, mode="standard")
            body.pop("max_output_tokens", None)
            body["previous_response_id"] = latest.rid
            self._submit(Create(lane, body))

    @rule(data=st.data(), count=st.integers(2, 5))
    def burst(self, data: st.DataObject, count: int) -> None:
        """Several creates at once, on several lanes: lanes run concurrently, each in FIFO order
        (WS-5); events of different lanes interleave on the socket."""
        self.tally["rule burst"] += 1
        sent: dict[str | None, int] = {}
        for _ in range(count):
            lane = data.draw(st.sampled_from(LANES), label="lane")
            model = self.lanes[lane]
            room = MAX_QUEUED - model.waiting() if model.busy else MAX_QUEUED
            if sent.get(lane, 0) >= room:
                continue
            sent[lane] = sent.get(lane, 0) + 1
            text = data.draw(user_texts, label="text")
            self._submit(Create(lane, self._body(data, lane, text)), settle=False)
        self._settle()

    @precondition(lambda self: any(lane.busy for lane in self.lanes.values()))
    @rule(data=st.data())
    def fill_queue(self, data: st.DataObject) -> None:
        """Creates behind a suspended append rollout wait (WS-5); one more than the lane holds
        is rejected with 429 websocket_queue_full (WS-6)."""
        self.tally["rule fill_queue"] += 1
        lane = pick(data, [n for n, m in self.lanes.items() if m.busy])
        for _ in range(MAX_QUEUED - self.lanes[lane].waiting() + 1):
            self._submit(Create(lane, self._body(data, lane, "queued", tools=[])), settle=False)
        self._settle()

    # ================================================================== rules: append mode
    @rule(
        data=st.data(),
        lane=st.sampled_from(LANES),
        text=user_texts,
        tools=st.lists(st.sampled_from(TOOL_NAMES), unique=True, min_size=1, max_size=3),
    )
    def start_append(
        self, data: st.DataObject, lane: str | None, text: str, tools: list[str]
    ) -> None:
        """An append-mode rollout (APPEND-1): per create, or by the connection's beta header."""
        self.tally["rule start_append"] += 1
        lane = self._free_lane(data, lane)
        mode = None if self.header_append else "append"
        items = [message(text, "easy")]
        body = self._body(data, lane, items, tools=tools, mode=mode, choices=append_tool_choices)
        self._submit(Create(lane, body))

    def _suspended(self) -> list[str]:
        return [rid for rid in self.appends if rid not in self.resumed]

    @precondition(lambda self: self._suspended())
    @rule(
        data=st.data(),
        verb=st.sampled_from(["response.append", "response.inject"]),
        variant=st.sampled_from(["all", "all", "partial", "big", "double"]),
    )
    def append(self, data: st.DataObject, verb: str, variant: str) -> None:
        """APPEND-2..4: answer the pending calls (all at once, in parts, with a big output, or
        twice in a row); the same response resumes."""
        self._append(data, verb, variant)

    @precondition(lambda self: self._suspended())
    @rule(
        data=st.data(),
        verb=st.sampled_from(["response.append", "response.inject"]),
        variant=st.sampled_from(
            ["empty", "wrong", "duplicate", "message", "reference", "bad_item", "unsupported"]
        ),
    )
    def append_rejected(self, data: st.DataObject, verb: str, variant: str) -> None:
        """APPEND-3/5: wrong, duplicate, non-output and malformed appends and injects are
        rejected and change nothing (ROLL-4); an empty one is accepted and holds."""
        self._append(data, verb, variant)

    def _append(self, data: st.DataObject, verb: str, variant: str) -> None:
        self.tally[f"append {variant}"] += 1
        rid = pick(data, self._suspended())
        live = self.appends[rid]
        outputs = _outputs(data, live.pending, shuffle=True)
        rejection: tuple[str, str] | None = None
        if variant in ("all", "big", "double"):
            if variant == "big":
                outputs[0]["output"] = "big output line\n" * 12_000  # ~190 kB
            elif data.draw(st.booleans(), label="image output"):
                image = {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}
                outputs[0]["output"] = [{"type": "input_text", "text": "see"}, image]
            items = outputs
        elif variant == "partial" and len(outputs) > 1:
            items = outputs[: min(data.draw(st.integers(1, 2)), len(outputs) - 1)]
        elif variant in ("partial", "empty"):
            items = []
        elif variant == "wrong":
            items = [outputs[0], tool_output("call_" + "f" * 24, "nope")]
            rejection = ("unknown_call_id", "input[1].call_id")
        elif variant == "duplicate":  # an earlier answered call, or the same call twice
            again = min(live.answered) if live.answered else outputs[0]["call_id"]
            items = [outputs[0], tool_output(again, "again")]
            rejection = ("duplicate_tool_output", "input[1].call_id")
        elif variant == "message":
            items = [outputs[0], {"role": "user", "content": "not an output"}]
            rejection = ("invalid_append_input", "input[1].type")
        elif variant == "reference":  # APPEND-3: item_reference is not an output either
            items = [outputs[0], {"type": "item_reference", "id": "msg_x"}]
            rejection = ("invalid_append_input", "input[1].type")
        elif variant == "unsupported":  # VAL-3: the simulator reads no files
            file_part = {"type": "input_file", "file_data": "eA=="}
            items = [{**outputs[0], "output": [file_part]}]
            rejection = ("unsupported_content", "input[0].output[0].type")
        else:  # bad_item
            bad, code, param = data.draw(st.sampled_from(BAD_INPUTS))
            items = [outputs[0], *bad]
            rejection = (code, param.format(i=1))
        if rejection is not None:  # an `error` on the target's lane, for both verbs
            code, param = rejection
            self.immediate.append(Immediate("error", {code}, param, live.lane, status=400))
        elif verb == "response.inject":  # APPEND-4: every accepted inject is acknowledged
            self.immediate.append(
                Immediate("response.inject.created", response_id=rid, stream_id=live.lane)
            )
        completes = False
        if rejection is None:
            committed = {item["call_id"] for item in items}
            completes = set(live.pending) <= committed
            live.answered |= committed
            live.pending = [cid for cid in live.pending if cid not in committed]
        if completes:
            self.checker.resumed(self.checker.by_id[rid])
            self.resumed.add(rid)
        self._send({"type": verb, "response_id": rid, "input": items})
        if variant == "double" and completes:
            shapes = self._double_append_errors(live)
            self.immediate.append(Immediate("error", shapes=shapes, status=400))
            self._send({"type": "response.append", "response_id": rid, "input": items})
        if rejection is None and not completes and verb == "response.append":
            self._barrier()  # APPEND-4: a partial append is acknowledged by nothing
        else:
            self._settle()

    @staticmethod
    def _double_append_errors(live: AppendLive) -> frozenset[ErrorShape]:
        """The answers to the same outputs appended again right after the append that resumed
        the rollout. The server reads the second append whenever it reads it (WS-5), so the
        rollout may be sampling (``response_not_waiting``, on the target's lane, param null,
        APPEND-5), finished (``response_already_completed``, a target error: param
        ``response_id`` and no ``stream_id``, APPEND-5, WS-7), or, with a forced tool choice,
        waiting for its next call (the first output is then a duplicate: VAL-2, APPEND-3).

        The shapes are exact because the resumed rollout frees its lane when it ends, and the
        creates queued behind it run meanwhile: one of them may fail with the same code (a
        ``dup_output`` history gets ``duplicate_tool_output`` at ``input[3].call_id`` on that
        lane) before or after this error (issue 13). Matching on the code alone let such a
        create's error stand in for this one."""
        shapes: set[ErrorShape] = {
            ("response_not_waiting", None, live.lane),
            ("response_already_completed", "response_id", None),
        }
        if live.forced_tool is not None:
            shapes.add(("duplicate_tool_output", "input[0].call_id", live.lane))
        return frozenset(shapes)

    @precondition(lambda self: self.finished_appends)
    @rule(data=st.data(), verb=st.sampled_from(["response.append", "response.inject"]))
    def late_append(self, data: st.DataObject, verb: str) -> None:
        """An append after the terminal event: response_already_completed (APPEND-5)."""
        self.tally["rule late_append"] += 1
        rid = pick(data, self.finished_appends[-64:])
        items = [tool_output("call_" + "a" * 24, "late")]
        if verb == "response.append":
            self.immediate.append(
                Immediate("error", {"response_already_completed"}, "response_id", status=400)
            )
        else:
            self.immediate.append(
                Immediate("response.inject.failed", {"response_already_completed"}, response_id=rid)
            )
        self._send({"type": verb, "response_id": rid, "input": items})
        self._settle()

    @rule(
        data=st.data(),
        verb=st.sampled_from(["response.append", "response.inject"]),
        garbage=st.booleans(),
    )
    def append_unknown_target(self, data: st.DataObject, verb: str, garbage: bool) -> None:
        """Targets that are not live append rollouts of this connection: unknown ids, standard
        responses, previous connections' rollouts: 404 response_not_found (APPEND-5)."""
        self.tally["rule append_unknown_target"] += 1
        rid = pick(data, ["resp_" + "9" * 32, "", "x" * 300, *self.standard_ids])
        if rid in self.appends or rid in self.finished_appends:
            return
        items: list[Any] = [tool_output("call_" + "b" * 24, "x")]
        if garbage:  # CONF-1: whatever the input, the notice parses with the SDK
            items = data.draw(st.lists(json_values, max_size=3))
        if verb == "response.append":
            self.immediate.append(
                Immediate("error", {"response_not_found"}, "response_id", status=404)
            )
        else:
            self.immediate.append(
                Immediate("response.inject.failed", {"response_not_found"}, response_id=rid)
            )
        self._send({"type": verb, "response_id": rid, "input": items})
        self._settle()

    # ================================================================== rules: bad frames
    @rule(
        data=st.data(),
        kind=st.sampled_from(
            ["invalid_json", "invalid_utf8", "binary", "not_object", "missing_type",
             "unknown_type", "wrong_field", "bad_stream_id", "steer", "huge_type",
             "huge_json", "huge_stream_id", "huge_field", "deep_nesting", "deep_field"]
        ),
    )  # fmt: skip
    def malformed_frame(self, data: st.DataObject, kind: str) -> None:
        """CODEC-2/3, WS-3, WS-4, EV-1: request-scoped errors; the socket stays usable (but
        for invalid UTF-8, which fails it with 1007, WS-15)."""
        self.tally["rule malformed_frame"] += 1
        assert self.conn is not None
        conn = self.conn
        expect = Immediate("error", status=400)
        text: str | None = None
        if kind == "invalid_json":
            text = data.draw(
                st.one_of(
                    st.text(min_size=1, max_size=40),
                    st.sampled_from(["0:", "[1,", '{"a":1}x', '{"type":"nope"', "1 2"]),
                ).filter(_not_json)
            )
            expect.codes, expect.param = {"invalid_json"}, None
        elif kind == "invalid_utf8":
            self._fail_with_1007()
            return
        elif kind == "binary":
            blob = data.draw(st.binary(max_size=64))
            self.immediate.append(
                Immediate("error", {"binary_frame_not_supported"}, None, status=400)
            )
            self.env.run(conn.send_binary(blob))
            self._settle()
            return
        elif kind == "not_object":
            value = data.draw(
                st.one_of(st.integers(), st.lists(json_values), st.text(max_size=9), st.none())
            )
            text = json.dumps(value)
            expect.codes, expect.param = {"invalid_event"}, None
        elif kind == "missing_type":
            obj = data.draw(st.dictionaries(st.text(max_size=6), json_values, max_size=4))
            obj.pop("type", None)
            if data.draw(st.booleans()):
                obj["type"] = None
            text = json.dumps(obj)
            expect.codes, expect.param = {"missing_required_parameter"}, "type"
        elif kind == "unknown_type":
            value = data.draw(
                st.one_of(safe_text, st.integers(), st.lists(st.integers(), max_size=2)).filter(
                    lambda v: v not in CLIENT_EVENT_TYPES and v != ""
                )
            )
            text = json.dumps({"type": value, "input": "x"})
            expect.codes, expect.param = {"unknown_event_type"}, "type"
            if not isinstance(value, str) or len(value) > 64:
                expect.not_echoed = json.dumps(value)[:40] if not isinstance(value, str) else value
        elif kind == "wrong_field":
            name, value, code, param = data.draw(st.sampled_from(WRONG_FIELDS))
            text = json.dumps({"type": "response.create", "input": "x", name: value})
            expect.codes, expect.param = {code}, param
        elif kind in ("bad_stream_id", "huge_stream_id"):
            value = (
                data.draw(st.sampled_from(BAD_STREAM_IDS))
                if kind == "bad_stream_id"
                else ("s" * 1_000_000)
            )
            text = json.dumps({"type": "response.create", "input": "x", "stream_id": value})
            expect.codes, expect.param = {"invalid_stream_id"}, "stream_id"
            expect.not_echoed = value if len(value) > 3 else None
        elif kind == "steer":
            self._steer(data)
            return
        elif kind == "huge_type":
            text = json.dumps({"type": "t" * 1_000_000})
            expect.codes, expect.param, expect.not_echoed = {"unknown_event_type"}, "type", "tttt"
        elif kind == "huge_json":
            text = '{"type": "response.create", "input": "' + "j" * 1_000_000
            expect.codes, expect.param = {"invalid_json"}, None
        elif kind == "huge_field":
            text = json.dumps({"type": "response.create", "input": 1, "x": "h" * 1_000_000})
            expect.codes, expect.param = {"invalid_type"}, "input"
        else:  # deep nesting: 10,000 nested arrays, as the frame or inside a field
            depth = 10_000
            nested = "[" * depth + "]" * depth
            if kind == "deep_nesting":
                text = nested
            else:
                text = '{"type":"response.create","input":' + nested + "}"
            expect.codes, expect.param = {"too_deeply_nested"}, None
        self.immediate.append(expect)
        assert text is not None
        self.env.run(conn.send_text(text))
        self._settle()

    def _steer(self, data: st.DataObject) -> None:
        """``response.steer`` of a response that is not live is answered with
        ``response.steer.failed`` (STEER-7); without its required fields it is a decoding
        error."""
        if data.draw(st.booleans()):
            self.immediate.append(
                Immediate("error", {"missing_required_parameter"}, "previous_response_id")
            )
            self._send({"type": "response.steer", "input": "x"})
        else:
            steer_input: Any = data.draw(user_texts)
            if data.draw(st.booleans()):  # CONF-1: echoed only in a shape the SDK accepts
                steer_input = data.draw(st.lists(json_values, max_size=3))
            self.immediate.append(Immediate("response.steer.failed"))
            # Not a live response: those are steered for real (rules: steering, STEER-1).
            live = {m.latest.rid for m in self.lanes.values() if m.latest} | set(self.appends)
            prev = pick(data, ["resp_x", *(rid for rid in self.known_ids if rid not in live)])
            self._send(
                {"type": "response.steer", "previous_response_id": prev, "input": steer_input}
            )
        self._settle()

    # ================================================================== rules: connections
    @rule(header=st.booleans())
    def reconnect(self, header: bool) -> None:
        """Close and reopen: the connection's cache, lanes and live rollouts are gone (WS-12,
        CACHE-1); stored responses stay continuable (STORE-1)."""
        self.tally["rule reconnect"] += 1
        self._retire_appends()
        self._disconnect()
        self._check_store()
        self._connect(header)

    def _fail_with_1007(self) -> None:
        """WS-15: a text frame that is not UTF-8 fails the connection with 1007 (RFC 6455
        §8.1), not an error event; what the socket owned is released as on any close (WS-12),
        stored responses stay continuable, and a new connection carries on."""
        assert self.conn is not None
        self._retire_appends()
        self.env.run(self.conn.send_raw_text(b'{"type":"response.create","input":"\xff\xfe"}'))
        assert self.env.run(self.conn.close_code()) == 1007, "WS-15"
        self.conn = None
        self._check_released()
        self._check_store()
        self._connect(self.header_append)

    def _retire_appends(self) -> None:
        """On close, suspended append rollouts are retired; with store=true they are stored as
        ``cancelled`` with the calls still unanswered (engine behaviour; see the report)."""
        for live in self.appends.values():
            if live.store and live.rid not in self.resumed:
                self.store[live.rid] = Cached(live.rid, list(live.pending))

    def _check_store(self) -> None:
        """Every stored response of this run is in the store with a terminal status (STORE-2),
        and its context has exactly the unanswered calls the model expects."""
        engine = self.env.live.engine
        for rid, entry in self.store.items():
            stored = self._run(engine.store.hydrate(rid))
            assert stored is not None, f"STORE-2: {rid} missing from the store"
            assert stored.record.response.status != "in_progress", f"{rid} stored in_progress"
            assert _unanswered(stored.items) == entry.pending, (rid, entry)

    @rule(
        data=st.data(),
        lane=st.sampled_from(LANES),
        frames=st.integers(0, 4),
        store=st.booleans(),
        tools=st.sampled_from([None, "append", "standard"]),
    )
    def disconnect_mid_stream(
        self, data: st.DataObject, lane: str | None, frames: int, store: bool, tools: str | None
    ) -> None:
        """Close the socket in the middle of a response: the rollout is cancelled (or has just
        finished), nothing keeps running, a stored response never stays in_progress (ROLL-7)."""
        self.tally["rule disconnect_mid_stream"] += 1
        if self.lanes[lane].busy is not None or self.lanes[lane].queue:
            return
        body: dict[str, Any] = {"type": "response.create", "input": "a long answer, please"}
        if lane is not None:
            body["stream_id"] = lane
        if tools is not None:
            body["tools"] = [TOOL_DEFS["get_weather"]]
            body["rollout_mode"] = tools
        if not store:
            body["store"] = False
        self._retire_appends()
        rid = self._run(self._send_and_cut(body, frames))
        self.conn = None
        self._check_released()
        if rid is not None and store:
            stored = self._run(self.env.live.engine.store.hydrate(rid))
            assert stored is not None, f"ROLL-7: {rid} was not stored"
            status = stored.record.response.status
            assert status in ("completed", "cancelled"), status
            self.store[rid] = Cached(rid, _unanswered(stored.items))
        self._check_store()
        self._connect(data.draw(st.booleans(), label="header"))

    async def _send_and_cut(self, body: dict[str, Any], frames: int) -> str | None:
        assert self.conn is not None
        conn = self.conn
        await conn.send(body)
        rid = None
        for _ in range(frames):
            event = await conn.recv()
            if event["type"] == "response.created":
                rid = event["response"]["id"]
            if event["type"] in ("response.completed", "response.done"):
                break
        await conn.close()
        return rid

    # ================================================================== rules: steering
    # STEER-1..STEER-9. Each rule plays one steering interleaving to its end on a lane of its
    # own (STEER_LANE, not in LANES: no other rule forks from it or steers into it), reading
    # the wire itself while every frame still goes through the StreamChecker. Everything else
    # is quiet then: the machine settles after every rule.
    @rule(
        data=st.data(),
        count=st.integers(1, 2),
        form=st.sampled_from(["string", "parts"]),
        after=st.integers(1, 60),
    )
    def steer_while_streaming(self, data: st.DataObject, count: int, form: str, after: int) -> None:
        """A steer (or two in a row) while the response streams. Each is accepted and applied at
        the next sampling boundary (incomplete ``steered`` then a successor) or, if it loses the
        race with the terminal event, accepted and applied by a successor after it, or refused
        with ``response_already_completed`` (STEER-2..4, STEER-9). The steer goes out after
        ``after`` text deltas: early, near the end (a race), or after the terminal event."""
        self.tally["rule steer_while_streaming"] += 1
        texts = [data.draw(steer_texts, label="steer text") for _ in range(count)]
        body = {"type": "response.create", "stream_id": STEER_LANE, "model": SLOW_MODEL,
                "rollout_mode": "standard",
                "input": "tell a long story about " + " ".join(["dragons"] * 40),
                "store": data.draw(stores, label="store")}  # fmt: skip
        self._run(self._steer_streaming(body, texts, form, after))

    async def _steer_streaming(
        self, body: dict[str, Any], texts: list[str], form: str, after: int
    ) -> None:
        assert self.conn is not None
        await self.conn.send(body)
        seen = await self._steer_recv("response.output_text.delta")
        rid = seen[0]["response"]["id"]
        ended: dict[str, Any] | None = None
        while after > 1 and ended is None:
            event = await self._steer_event()
            after -= event["type"] == "response.output_text.delta"
            if event["type"] in TERMINAL_TYPES:
                ended = event["response"]
                self.tally["steer after the terminal event"] += 1
        for text in texts:
            steer_input: Any = text if form == "string" else [message(text, "parts")]
            await self.conn.send(
                {"type": "response.steer", "previous_response_id": rid, "input": steer_input}
            )
        accepted: list[str] = []
        refused = 0
        successor: dict[str, Any] | None = None
        while len(accepted) + refused < len(texts) or ended is None or (accepted and not successor):
            event = await self._steer_event()
            kind = event["type"]
            if kind == "response.steer.accepted":
                assert ended is None, "STEER-1: accepted after the target ended"
                accepted.append(texts[len(accepted) + refused])
                self.tally["steer accepted"] += 1
            elif kind == "response.steer.failed":
                assert event["error"]["code"] == "response_already_completed", event
                assert ended is not None, "STEER-7: refused while the target was live"
                refused += 1
                self.tally["steer lost the race"] += 1
            elif kind in ("response.completed", "response.incomplete"):
                final = event["response"]
                if final["id"] == rid:
                    ended = final
                    self.tally[f"steered target {final['status']}"] += 1
                else:
                    successor = final
        assert ended is not None
        if ended["status"] == "incomplete":
            assert ended["incomplete_details"]["reason"] == "steered" and accepted, ended
        if accepted:  # STEER-4: one successor, the steering input in submission order
            assert successor is not None and successor["previous_response_id"] == rid
            assert successor["status"] == "completed", successor
            text = successor["output"][0]["content"][0]["text"]
            last = " ".join(accepted[-1].split()[:40])
            assert text == f"This is a simulated answer to: {last}", (text, accepted)
        else:
            assert successor is None

    @rule(
        data=st.data(),
        count=st.integers(1, 2),
        invalid=st.booleans(),
        then=st.sampled_from(["continue", "continue", "replace", "fail", "warmup", "append"]),
    )
    def steer_while_waiting(
        self, data: st.DataObject, count: int, invalid: bool, then: str
    ) -> None:
        """Steering a standard response that stopped for tool outputs: pending, then prepended
        to the fast-path continuation; or returned (``response_not_active``) when the rollout is
        replaced, fails its continuation, or is forked by a warmup (STEER-5, STEER-6, STEER-7).
        In append mode the input joins the context after the appended outputs, and the same
        response samples again (STEER-5)."""
        self.tally["rule steer_while_waiting"] += 1
        self.tally[f"steer waiting then {then}"] += 1
        texts = [data.draw(steer_texts, label="steer text") for _ in range(count)]
        if then == "append":
            self._run(self._steer_append(texts[0]))
            return
        outputs = [data.draw(steer_texts, label="tool output") for _ in range(3)]
        store = data.draw(stores, label="store")
        self._run(self._steer_waiting(texts, outputs, invalid, then, store))

    async def _steer_waiting(
        self, texts: list[str], outputs: list[str], invalid: bool, then: str, store: bool
    ) -> None:
        assert self.conn is not None
        tools = [TOOL_DEFS["get_weather"], TOOL_DEFS["lookup"]]
        base = {"type": "response.create", "stream_id": STEER_LANE, "model": "sim",
                "rollout_mode": "standard",
                "tools": tools, "store": store}  # fmt: skip
        await self.conn.send({**base, "input": "get_weather and lookup please"})
        done = (await self._steer_recv("response.completed"))[-1]["response"]
        calls = [o for o in done["output"] if o["type"] == "function_call"]
        assert calls, done
        rid = done["id"]
        if invalid:  # STEER-7: numbered by the target, no id
            bad = [{"type": "message", "role": "assistant", "content": "not a user"}]
            await self.conn.send({"type": "response.steer", "previous_response_id": rid,
                                  "input": bad})  # fmt: skip
            event = await self._steer_event()
            assert event["type"] == "response.steer.failed", event
            assert event["error"]["code"] == "invalid_input" and "id" not in event["steer"]
        ids = []
        for text in texts:
            await self.conn.send(
                {"type": "response.steer", "previous_response_id": rid, "input": text}
            )
            accepted, pending = await self._steer_event(), await self._steer_event()
            assert accepted["type"] == "response.steer.accepted", accepted
            assert pending["type"] == "response.steer.pending", pending
            assert pending["steer"]["id"] == accepted["steer"]["id"]
            stubs = [(s["call_id"], s["name"]) for s in pending["required_input"]]
            assert stubs == [(c["call_id"], c["name"]) for c in calls], "STEER-5 stubs"
            ids.append(accepted["steer"]["id"])
        answers = [tool_output(c["call_id"], outputs[i]) for i, c in enumerate(calls)]
        if then == "continue":  # STEER-5: the same coroutine resumes with the input first
            await self.conn.send({**base, "previous_response_id": rid, "input": answers})
            final = (await self._steer_recv("response.completed"))[-1]["response"]
            shown = "; ".join(" ".join(o.split()[:24]) for o in outputs[: len(calls)])
            steered = "; ".join(" ".join(t.split()[:24]) for t in texts)
            expected = f"Based on the tool results: {shown} (steered: {steered})"
            assert final["output"][0]["content"][0]["text"] == expected, final["output"]
            self.tally["steer committed by a continuation"] += 1
            return
        if then == "replace":  # the lane's cache moves on: the rollout is retired
            await self.conn.send({**base, "input": "something else", "tools": []})
        elif then == "fail":  # a failed continuation evicts its parent (CACHE-3)
            await self.conn.send({**base, "previous_response_id": rid, "input": answers[1:]
                                  if len(answers) > 1 else []})  # fmt: skip
        else:  # a warmup continuation never resumes: the cache path retires the rollout
            await self.conn.send({**base, "previous_response_id": rid, "input": answers,
                                  "generate": False})  # fmt: skip
        returned: list[str] = []
        finished = False
        while len(returned) < len(texts) or not finished:
            event = await self._steer_event()
            if event["type"] == "response.steer.failed":
                assert event["error"]["code"] == "response_not_active", event
                assert event["steer"]["previous_response_id"] == rid
                returned.append(event["steer"]["id"])
                assert event["steer"]["input"] == texts[len(returned) - 1], "STEER-6 input"
            elif event["type"] == "error":
                assert then == "fail" and event["error"]["code"] == "tool_output_missing"
                finished = True
            elif event["type"] in TERMINAL_TYPES:
                finished = True
        assert returned == ids, "STEER-6: every queued submission comes back, in order"
        self.tally["steer returned"] += len(returned)

    async def _steer_append(self, text: str) -> None:
        assert self.conn is not None
        await self.conn.send(
            {"type": "response.create", "stream_id": STEER_LANE, "model": "sim",
             "rollout_mode": "append", "tools": [TOOL_DEFS["noop"]], "input": "noop now"}
        )  # fmt: skip
        suspended = (await self._steer_recv("response.done"))[-1]
        rid = suspended["response"]["id"]
        await self.conn.send({"type": "response.steer", "previous_response_id": rid, "input": text})
        assert (await self._steer_event())["type"] == "response.steer.accepted"
        assert (await self._steer_event())["type"] == "response.steer.pending"
        rounds = 0
        while True:  # the steering message makes the simulator call the tool once more
            pending = suspended["pending_calls"]
            self.checker.resumed(self.checker.by_id[rid])
            answers = [tool_output(c["call_id"], "ok") for c in pending]
            await self.conn.send({"type": "response.append", "response_id": rid, "input": answers})
            rounds += 1
            last = (await self._steer_recv("response.done", *TERMINAL_TYPES))[-1]
            if last["type"] != "response.done":
                break
            suspended = last
        assert last["type"] == "response.completed" and rounds == 2, (last["type"], rounds)

    async def _steer_event(self) -> dict[str, Any]:
        """One frame of the steering lane (every frame is checked by the StreamChecker)."""
        assert self.conn is not None
        event = await self.conn.recv()
        self.checker.feed(event)
        lane = event.get("stream_id")
        steer = event["type"].startswith("response.steer.") and event["sequence_number"] == 0
        assert lane == STEER_LANE or steer, f"unexpected event during a steering rule: {event}"
        return event

    async def _steer_recv(self, *kinds: str) -> list[dict[str, Any]]:
        seen = [await self._steer_event()]
        while seen[-1]["type"] not in kinds:
            seen.append(await self._steer_event())
        return seen

    # ================================================================== teardown
    def teardown(self) -> None:
        try:
            if self.conn is not None and not self.broken:
                self._probe()
                self._retire_appends()
                self._disconnect()
                self._check_store()
        finally:
            if self.conn is not None:
                self.env.run(self.conn.close())
            validate_recorded(self.recorded_start)

    def _probe(self) -> None:
        """The socket is still usable after everything that happened (ERR-4)."""
        lane = self.lanes[None]
        target = None if lane.busy is None and not lane.queue else "probe"
        if target is not None and target not in self.lanes:
            self.lanes[target] = LaneModel()
        body: dict[str, Any] = {"type": "response.create", "input": "probe", "generate": False}
        if target is not None:
            body["stream_id"] = target
        self._submit(Create(target, body))


def _unanswered(context: list[Any]) -> list[str]:
    """Function calls in a stored context that have no output."""
    answered = {i.call_id for i in context if type(i).__name__ == "FunctionCallOutput"}
    return [
        i.call_id
        for i in context
        if type(i).__name__ == "FunctionCall" and i.call_id not in answered
    ]


def pick(data: st.DataObject, options: list[T]) -> T:
    """One of ``options``, drawn the same way whatever their number (so a replay that finds a
    different number, e.g. after a race, does not make hypothesis' data generation flaky)."""
    return options[data.draw(st.integers(0, 1 << 16), label="pick") % len(options)]


def _outputs(data: st.DataObject, call_ids: list[str], shuffle: bool = False) -> list[Any]:
    """Tool outputs for ``call_ids`` (at most 3), from draws of a fixed shape."""
    texts = data.draw(st.lists(output_texts, min_size=3, max_size=3), label="outputs")
    parts = data.draw(st.lists(st.booleans(), min_size=3, max_size=3), label="as parts")
    order = data.draw(st.permutations(range(3))) if shuffle else range(3)
    return [tool_output(call_ids[i], texts[i], parts[i]) for i in order if i < len(call_ids)]


def _text_of(item: dict[str, Any]) -> str:
    content = item.get("content", "")
    if isinstance(content, str):
        return content
    return "\n".join(part.get("text", "") for part in content)


def _not_json(text: str) -> bool:
    try:
        msgspec.json.decode(text.encode())
    except msgspec.DecodeError:
        return True
    return False


def _recorded() -> list[bytes]:
    from tests.conftest import RECORDED

    return RECORDED


def _router() -> Router:
    """The built-in routes at full speed, plus a paced simulator for the steering rules."""
    router = simulator_router(0)
    router.routes[SLOW_MODEL] = SimulatedModel(SLOW_TPS)
    return router


@pytest.fixture
def ws_env() -> Any:
    # Parking (PARK-1) is off here: this model has a closed connection's rollouts retired
    # (WS-12). tests/server/test_park_functional.py covers parked rollouts.
    config = EngineConfig(tokens_per_second=0, max_queued_creates=MAX_QUEUED, park_seconds=0)
    env = LiveEnv(config, _router())
    try:
        yield env
    finally:
        env.close()


@pytest.mark.timeout(timeout_for(120))
def test_ws_protocol_state_machine(ws_env: LiveEnv) -> None:
    machine = type("WsMachine", (WsProtocolMachine,), {"env": ws_env, "tally": Counter()})
    run_state_machine_as_test(
        machine,
        settings=settings(max_examples=examples(ci=1.0, deep=0.2), stateful_step_count=40),
    )
    counters = ws_env.live.engine.counters
    report("WsProtocolMachine", machine.runs, machine.tally, counters)
