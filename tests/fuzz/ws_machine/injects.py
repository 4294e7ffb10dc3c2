"""Rules: ``response.inject`` into standard-mode responses, OpenAI's multi-agent beta
(INJECT-1..INJECT-9). Append-mode injects are in ``appends.py`` (they share APPEND-3..5)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from tests.fuzz.ws_machine.base import MachineBase
from tests.fuzz.ws_machine.model import (
    LANES,
    Cached,
    Create,
    Immediate,
    _outputs,
    pick,
    tool_output,
)


class InjectRules(MachineBase):
    """Rules: injects into a standard-mode response that completed with calls and waits in its
    lane's cache; the last one continues it in a successor queued on its lane (INJECT-5)."""

    def _inject_targets(self) -> list[str | None]:
        """Lanes whose latest response waits for its calls (INJECT-2): it completed with calls
        (a response cut by ``max_output_tokens`` does not wait), nothing runs or queues there."""
        if not self.multi_agent:
            return []
        return [
            name
            for name in LANES
            if (latest := self.lanes[name].latest) is not None
            and latest.pending
            and latest.status == "completed"
            and latest.body is not None
            and self.lanes[name].busy is None
            and not self.lanes[name].queue
        ]

    @precondition(lambda self: self._inject_targets())
    @rule(
        data=st.data(),
        variant=st.sampled_from(["all", "all", "split", "wrong", "duplicate", "message"]),
    )
    def inject_standard(self, data: st.DataObject, variant: str) -> None:
        """INJECT-3..INJECT-5, INJECT-8: accepted injects are acknowledged with the target's
        lane; the last one queues the continuation on that lane, which runs as a create
        chained on the target; a rejected one is an `error` there and changes nothing."""
        self.tally[f"inject standard {variant}"] += 1
        lane = pick(data, self._inject_targets())
        target = self.lanes[lane].latest
        assert target is not None
        held = self.held.setdefault(target.rid, set())
        self._drop_stale_held()
        open_calls = [cid for cid in target.pending if cid not in held]
        outputs = _outputs(data, open_calls, shuffle=True)
        if variant == "wrong":
            self._rejected(
                target,
                lane,
                [outputs[0], tool_output("call_" + "e" * 24, "x")],
                ("unknown_call_id", "input[1].call_id"),
            )
        elif variant == "duplicate" and held:
            self._rejected(
                target,
                lane,
                [tool_output(min(held), "again")],
                ("duplicate_tool_output", "input[0].call_id"),
            )
        elif variant == "message":
            self._rejected(
                target,
                lane,
                [outputs[0], {"role": "user", "content": "no"}],
                ("invalid_append_input", "input[1].type"),
            )
        elif variant == "split" and len(outputs) > 1:
            self._accepted(target, lane, outputs[:1])
        else:
            self._accepted(target, lane, outputs)

    def _drop_stale_held(self) -> None:
        """What the server holds for targets that are no longer any lane's latest is gone."""
        live = {lane.latest.rid for lane in self.lanes.values() if lane.latest is not None}
        for rid in [r for r in self.held if r not in live]:
            del self.held[rid]

    def _rejected(
        self, target: Cached, lane: str | None, items: list[Any], error: tuple[str, str]
    ) -> None:
        code, param = error
        self.immediate.append(Immediate("error", {code}, param, lane, status=400))
        self._send({"type": "response.inject", "response_id": target.rid, "input": items})
        self._settle()

    def _accepted(self, target: Cached, lane: str | None, items: list[Any]) -> None:
        held = self.held[target.rid]
        held |= {item["call_id"] for item in items}
        self.immediate.append(
            Immediate("response.inject.created", response_id=target.rid, stream_id=lane)
        )
        if set(target.pending) <= held:  # the last call answered: the continuation (INJECT-5)
            del self.held[target.rid]
            assert target.body is not None
            body = {
                **target.body,
                "input": [tool_output(cid, "ok") for cid in target.pending],
                "previous_response_id": target.rid,
                "rollout_mode": "standard",
            }
            body.pop("generate", None)
            self.lanes[lane].queue.append(Create(lane, body))  # the server queues it itself
        self._send({"type": "response.inject", "response_id": target.rid, "input": items})
        self._settle()
