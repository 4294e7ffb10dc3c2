"""The WebSocket machine's base: connection, I/O, prediction, create helpers."""

from __future__ import annotations

from collections import Counter, deque
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
)

from tests.fuzz._support import (
    LiveEnv,
    StreamChecker,
    WsConn,
)
from tests.fuzz.ws_machine.model import (
    APPEND_BETA,
    LANES,
    MAX_QUEUED,
    MULTI_AGENT_BETA,
    TOOL_DEFS,
    AppendLive,
    Cached,
    Create,
    Immediate,
    LaneModel,
    Outcome,
    _recorded,
    _resolve_references,
    _text_of,
    expected_calls,
    forced_tool,
    last_kind,
    message,
    safe_text,
    small_budgets,
    stores,
    tool_choices,
    tool_sets,
)


class MachineBase(RuleBasedStateMachine):
    """The connection, the I/O, the prediction of each create's outcome and the create helpers;
    the event dispatch (``events.py``) and the rule groups build on it."""

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
    def _connect(self, header: bool, multi_agent: bool = True) -> None:
        """``header``: append mode by default (APPEND-1); ``multi_agent``: OpenAI's multi-agent
        beta, so standard-mode responses take ``response.inject`` (INJECT-1)."""
        self.header_append, self.multi_agent = header, multi_agent
        betas = [APPEND_BETA["OpenAI-Beta"]] if header else []
        betas += [MULTI_AGENT_BETA] if multi_agent else []
        headers = {"OpenAI-Beta": ", ".join(betas)} if betas else None
        self.conn = self.env.run(WsConn.open(self.env, headers))
        self.held: dict[str, set[str]] = {}  # standard-mode inject outputs held per target
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

    def _on_event(self, event: dict[str, Any]) -> None:
        """Track one frame; ``EventTracking`` (events.py) is the one implementation."""
        raise NotImplementedError

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
