"""Every frame from the server, checked and folded into the model (ORD-*, ERR-*, WS-7)."""

from __future__ import annotations

from typing import Any

from tests.fuzz._support import (
    Note,
    Tracked,
)
from tests.fuzz.ws_machine.base import MachineBase
from tests.fuzz.ws_machine.model import (
    AppendLive,
    Cached,
    Create,
    Outcome,
)


class EventTracking(MachineBase):
    """Every frame from the server, checked and folded into the model (ORD-*, ERR-*, WS-7)."""

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
        assert (response["tools"], response["instructions"]) == ([], None), "RESP-5"
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
            sent = [t["name"] for t in create.body.get("tools", [])]
            assert [t["name"] for t in final["tools"]] == sent, "RESP-2, RESP-5"
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
            body = create.body if create is not None else None
            entry = Cached(tracked.id, pending, body, final["status"])
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
