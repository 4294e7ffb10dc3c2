"""Rules: stateless creates, continuations, warmups, tool round trips, bursts, full queues."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import (
    precondition,
    rule,
)

from tests.fuzz.ws_machine.base import MachineBase
from tests.fuzz.ws_machine.model import (
    BAD_INPUTS,
    LANES,
    MAX_QUEUED,
    TOOL_NAMES,
    Cached,
    Create,
    _outputs,
    message,
    message_forms,
    output_texts,
    pick,
    tool_output,
    user_texts,
)

# What follows ``rseal1.`` in a forged sealed-reasoning blob: any text, the format's own
# alphabet (dots and base64url) weighted in (SEAL-7: no key opens it).
forged_blobs = st.text(alphabet="abcXYZ019-_.=+/ é", max_size=80)


class CreateRules(MachineBase):
    """Rules: stateless creates, continuations, warmups, tool round trips, bursts, full queues."""

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
             "dup_output", "orphan_output", "unknown_reference", "image", "forged_seal"]
        ),
    )  # fmt: skip
    def create_history(self, data: st.DataObject, lane: str | None, text: str, shape: str) -> None:
        """A stateless create that carries a history (the Agents SDK's full resend): replayed
        calls and outputs, item_reference (ITEM-4), reasoning (ITEM-5), images (VAL-3), a
        blob in the engine's sealed format that no key opens (SEAL-7)."""
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
            "forged_seal": [
                user,
                {"type": "reasoning", "id": "rs_1", "summary": [],
                 "encrypted_content": "rseal1."},
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
        elif shape == "forged_seal":  # drawn only here: recorded runs replay their draws
            items[1]["encrypted_content"] += data.draw(forged_blobs, label="blob")
            fault = ("invalid_encrypted_content", "input[1].encrypted_content")
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
