"""Rules: reconnects and disconnects mid-stream (WS-12, STORE-1/2)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import (
    rule,
)

from tests.fuzz.ws_machine.base import MachineBase
from tests.fuzz.ws_machine.model import (
    LANES,
    TOOL_DEFS,
    Cached,
    _unanswered,
)


class ConnectionRules(MachineBase):
    """Rules: reconnects and disconnects mid-stream (WS-12, STORE-1/2)."""

    # ================================================================== rules: connections
    @rule(header=st.booleans(), multi_agent=st.booleans())
    def reconnect(self, header: bool, multi_agent: bool) -> None:
        """Close and reopen: the connection's cache, lanes and live rollouts are gone (WS-12,
        CACHE-1); stored responses stay continuable (STORE-1)."""
        self.tally["rule reconnect"] += 1
        self._retire_appends()
        self._disconnect()
        self._check_store()
        self._connect(header, multi_agent)

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
