"""Rules: steering while a response streams or waits for tool outputs (STEER-*)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import (
    rule,
)

from protocol.events import TERMINAL_TYPES
from tests.fuzz.ws_machine.base import MachineBase
from tests.fuzz.ws_machine.model import (
    SLOW_MODEL,
    STEER_LANE,
    TOOL_DEFS,
    message,
    steer_texts,
    stores,
    tool_output,
)


class SteeringRules(MachineBase):
    """Rules: steering while a response streams or waits for tool outputs (STEER-*)."""

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
