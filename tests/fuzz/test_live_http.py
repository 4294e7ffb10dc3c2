"""A hypothesis state machine driving a real server over HTTP on loopback.

``HttpProtocolMachine`` interleaves ``POST /v1/responses`` (JSON and SSE ``stream: true``) —
stateless, continuing stored or unknown responses with right and wrong tool outputs, warmups,
malformed bodies — with ``GET``/``DELETE``/``cancel``/``input_items`` on stored and unknown ids,
wrong methods and unknown paths. The model is the store (STORE-1..3: only ``store: true``
responses, continuable over HTTP until deleted; HTTP-5: ``store: false`` parents are never
found). Every answer is checked: statuses and the error envelope of §12 (ERR-2, ERR-3), SSE
framing (HTTP-3: ``event:`` equals the JSON ``type``, the stream ends right after the terminal
event, no ``[DONE]``), the event stream itself (ORD-*), the JSON Response (RESP-1), listing
pages (HTTP-6), and that no request leaves a session or a task behind.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    precondition,
    rule,
    run_state_machine_as_test,
)
from openai.types.responses import Response

from engine.core import EngineConfig
from engine.store.embedded.sqlite import SqliteStore
from tests.fuzz._support import (
    LiveEnv,
    StreamChecker,
    check_error_body,
    examples,
    report,
    timeout_for,
    validate_recorded,
)
from tests.fuzz.ws_machine.model import (
    BAD_INPUTS,
    TOOL_DEFS,
    TOOL_NAMES,
    WRONG_FIELDS,
    _outputs,
    _recorded,
    _unanswered,
    expected_calls,
    last_kind,
    message,
    message_forms,
    pick,
    small_budgets,
    tool_choices,
    user_texts,
)

UNKNOWN = "resp_" + "0" * 32


@dataclass
class Stored:
    rid: str
    pending: list[str]
    inputs: int  # how many input items the request had (HTTP-6 listing)


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    text: str

    def json(self) -> Any:
        return json.loads(self.text)


class HttpProtocolMachine(RuleBasedStateMachine):
    env: LiveEnv
    runs = 0
    tally: Counter[str]

    def __init__(self) -> None:
        super().__init__()
        type(self).runs += 1
        self.recorded_start = len(_recorded())
        self.baseline = self.env.task_count()
        self.store: dict[str, Stored] = {}
        self.deleted: list[str] = []
        self.unstored: list[str] = []  # store=false responses: never found over HTTP
        self.background_ids: set[str] = set()  # finished background responses (BG-6)
        self.broken = False

    # ================================================================== I/O
    def _request(
        self, method: str, path: str, body: Any = None, raw: bytes | str | None = None
    ) -> Reply:
        try:
            return self.env.run(self._request_async(method, path, body, raw), timeout=60)
        except BaseException:
            self.broken = True
            raise

    async def _request_async(
        self, method: str, path: str, body: Any, raw: bytes | str | None
    ) -> Reply:
        url = f"http://127.0.0.1:{self.env.live.port}{path}"
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        headers = {"Content-Type": "application/json"} if data is not None else {}
        async with self.env.client.request(method, url, data=data, headers=headers) as response:
            text = await response.text()
            return Reply(response.status, dict(response.headers), text)

    def _error(self, reply: Reply, status: int | tuple[int, ...], code: str, param: Any) -> None:
        """ERR-2: exactly ``{"error": {type, code, message, param}}`` with the error's status."""
        statuses = status if isinstance(status, tuple) else (status,)
        assert reply.status in statuses, (reply.status, reply.text[:300])
        assert reply.headers.get("Content-Type", "").startswith("application/json")
        body = reply.json()
        assert set(body) == {"error"}, body
        error = check_error_body(body["error"], reply.status)
        assert error["code"] == code, (error, code)
        if param is not False:
            assert error["param"] == param, (error, param)
        self.tally[f"error {code}"] += 1

    # ================================================================== creates
    @rule(
        data=st.data(),
        text=user_texts,
        form=message_forms,
        streaming=st.booleans(),
        tools=st.lists(st.sampled_from(TOOL_NAMES), unique=True, max_size=3),
    )
    def create(
        self, data: st.DataObject, text: str, form: str, streaming: bool, tools: list[str]
    ) -> None:
        """A stateless create (COMPAT-5), JSON or SSE; sometimes a warmup (§15 #13)."""
        self.tally["rule create"] += 1
        items: Any = text if form == "string" else [message(text, form)]
        body = self._body(data, items, tools, streaming)
        if data.draw(st.integers(0, 5), label="warmup") == 0:
            body["generate"] = False
        self._create(body, None, fault=None)

    @precondition(lambda self: self.store or self.unstored or self.deleted)
    @rule(
        data=st.data(),
        streaming=st.booleans(),
        parent_kind=st.sampled_from(["stored", "stored", "stored", "unstored", "deleted", "none"]),
        variant=st.sampled_from(
            ["answer", "answer", "answer_user", "missing", "wrong_id", "duplicate", "bad_item",
             "background", "append_mode", "stream_id"]
        ),
    )  # fmt: skip
    def continue_response(
        self, data: st.DataObject, streaming: bool, parent_kind: str, variant: str
    ) -> None:
        """previous_response_id over HTTP is served from the store only (HTTP-5, COMPAT-4)."""
        self.tally["rule continue"] += 1
        self.tally[f"continue {parent_kind} {variant}"] += 1
        pool = {"stored": list(self.store), "unstored": self.unstored, "deleted": self.deleted}
        rid = pick(data, pool.get(parent_kind) or [UNKNOWN])
        parent = self.store.get(rid)
        pending = parent.pending if parent is not None else []
        items: list[Any] = _outputs(data, pending)
        if variant == "answer_user" or not pending:
            items.append(message(data.draw(user_texts), "easy"))
        fault: tuple[str, str | None] | None = None
        if variant == "missing" and pending:
            items = items[1:]
        elif variant == "wrong_id":
            items.append({"type": "function_call_output", "call_id": "call_x", "output": "x"})
        elif variant == "duplicate" and pending:
            items.append(items[0])
        elif variant == "bad_item":
            bad, code, param = data.draw(st.sampled_from(BAD_INPUTS))
            fault = (code, param.format(i=len(items)))
            items += bad
        tools = data.draw(st.lists(st.sampled_from(TOOL_NAMES), unique=True, max_size=3))
        body = self._body(data, items, tools, streaming)
        body["previous_response_id"] = rid
        if variant == "background":  # BG-1: a background response must be stored
            body["background"] = True
            body["store"] = False
            fault = ("invalid_value", "store")
        elif variant == "append_mode":  # HTTP-5: append mode needs the socket
            body["rollout_mode"] = "append"
            fault = ("unsupported_parameter", "rollout_mode")
        elif variant == "stream_id":  # WS-2: ignored over HTTP, even when invalid
            body["stream_id"] = data.draw(st.sampled_from(["a", "bad lane!", "", "x" * 300]))
        self._create(body, parent, fault)

    def _body(
        self, data: st.DataObject, items: Any, tools: list[str], streaming: bool
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"model": "sim", "input": items}
        if streaming:
            body["stream"] = True
        if tools:
            body["tools"] = [TOOL_DEFS[name] for name in tools]
            choice = data.draw(tool_choices, label="tool_choice")
            if choice == "function":
                body["tool_choice"] = {"type": "function", "name": tools[-1]}
            elif choice != "auto":
                body["tool_choice"] = choice
            if data.draw(st.booleans(), label="serial"):
                body["parallel_tool_calls"] = False
        if data.draw(st.booleans(), label="store=false"):
            body["store"] = False
        budget = data.draw(small_budgets, label="max_output_tokens")
        if budget is not None:
            body["max_output_tokens"] = budget
        return body

    def _create(
        self, body: dict[str, Any], parent: Stored | None, fault: tuple[str, str | None] | None
    ) -> None:
        reply = self._request("POST", "/v1/responses", body)
        prev = body.get("previous_response_id")
        error = self._predict(body, parent, fault)
        if error is not None:  # HTTP-4: JSON error, also when stream is true
            self._error(reply, 400, error[0], error[1])
            return
        assert reply.status == 200, (reply.status, reply.text[:300], body)
        if body.get("stream"):
            final = self._sse(reply)
        else:
            assert reply.headers.get("Content-Type", "").startswith("application/json")
            final = reply.json()
            Response.model_validate(final)  # RESP-1 / CONF-1
        self.tally[f"response {final['status']}"] += 1
        assert final["previous_response_id"] == prev and final["store"] == body.get("store", True)
        self._check_result(body, final)
        rid = final["id"]
        if body.get("store", True):
            record = self.env.run(self.env.live.engine.store.hydrate(rid))
            assert record is not None, "STORE-2: a store=true response is stored"
            pending = [
                o["call_id"]
                for o in final["output"]
                if o["type"] == "function_call" and o["status"] == "completed"
            ]
            assert _unanswered(record.items) == pending
            count = 1 if isinstance(body["input"], str) else len(body["input"])
            self.store[rid] = Stored(rid, pending, count)
        else:
            assert self.env.run(self.env.live.engine.store.get(rid)) is None, "STORE-1"
            self.unstored.append(rid)

    def _predict(
        self, body: dict[str, Any], parent: Stored | None, fault: tuple[str, str | None] | None
    ) -> tuple[str, str | None] | None:
        prev = body.get("previous_response_id")
        if fault is not None:  # raised while admitting, before the parent is looked up
            return fault
        if prev is not None and parent is None:
            return ("previous_response_not_found", "previous_response_id")
        items = body["input"] if isinstance(body["input"], list) else [{"role": "user"}]
        pending = parent.pending if parent is not None else []
        seen: set[str] = set()
        for index, item in enumerate(items):
            if item.get("type") != "function_call_output":
                continue
            if item["call_id"] not in pending:
                return ("unknown_call_id", f"input[{index}].call_id")
            if item["call_id"] in seen:
                return ("duplicate_tool_output", f"input[{index}].call_id")
            seen.add(item["call_id"])
        if any(call not in seen for call in pending):
            return ("tool_output_missing", "input")
        return None

    def _check_result(self, body: dict[str, Any], final: dict[str, Any]) -> None:
        status = final["status"]
        assert status in ("completed", "incomplete"), status
        if body.get("generate") is False:
            assert status == "completed" and final["output"] == []
            assert final["usage"]["output_tokens"] == 0
            return
        if status == "incomplete":
            assert body.get("max_output_tokens") is not None
            assert final["incomplete_details"]["reason"] == "max_output_tokens"
            return
        items = body["input"]
        if not isinstance(items, list):
            items = [{"role": "user", "content": items}]
        tools = [t["name"] for t in body.get("tools", [])]
        calls = expected_calls(
            _text(items[-1]),
            tools,
            body.get("tool_choice", "auto"),
            body.get("parallel_tool_calls", True),
            last_kind(items),
        )
        names = [o["name"] for o in final["output"] if o["type"] == "function_call"]
        if calls is not None:
            assert names == calls, (names, calls)
        else:
            assert names == [] and len(final["output"]) == 1, final["output"]

    def _sse(self, reply: Reply) -> dict[str, Any]:
        """HTTP-3: SSE framing, one event per block, ending right after the terminal event."""
        assert reply.headers.get("Content-Type", "").startswith("text/event-stream"), reply
        assert reply.headers.get("Cache-Control") == "no-cache"
        assert "[DONE]" not in reply.text
        assert reply.text.endswith("\n\n"), reply.text[-100:]
        checker = StreamChecker()
        blocks = reply.text[:-2].split("\n\n")
        final = None
        for index, block in enumerate(blocks):
            lines = block.split("\n")
            assert len(lines) == 2 and lines[0].startswith("event: "), block[:200]
            assert lines[1].startswith("data: "), block[:200]
            event = json.loads(lines[1][len("data: ") :])
            assert event["type"] == lines[0][len("event: ") :], "HTTP-3: event name = type"
            assert event["type"] != "error", "HTTP-4: no SSE error events"
            assert "stream_id" not in event, "WS-2: stream_id ignored over HTTP"
            note = checker.feed(event)
            if note.kind == "terminal":
                assert index == len(blocks) - 1, "HTTP-3: the stream ends at the terminal"
                assert note.response is not None
                final = note.response.final
        assert final is not None, "SSE stream without a terminal event"
        return final

    # ================================================================== stored responses
    def _any_id(self, data: st.DataObject) -> str:
        pool = [*self.store, *self.deleted, *self.unstored, UNKNOWN]
        return pick(data, pool)

    @rule(data=st.data())
    def stored_get(self, data: st.DataObject) -> None:
        """HTTP-6: GET a stored response, or 404 response_not_found."""
        self.tally["rule retrieve"] += 1
        rid = self._any_id(data)
        reply = self._request("GET", f"/v1/responses/{rid}")
        if rid in self.store:
            assert reply.status == 200, reply
            response = reply.json()
            assert response["id"] == rid and response["status"] in ("completed", "incomplete")
        else:
            self._error(reply, 404, "response_not_found", None)

    @rule(data=st.data())
    def stored_delete(self, data: st.DataObject) -> None:
        """HTTP-6: DELETE; afterwards the id is gone (GET 404, not continuable)."""
        self.tally["rule delete"] += 1
        rid = self._any_id(data)
        reply = self._request("DELETE", f"/v1/responses/{rid}")
        if rid in self.store:
            assert reply.status == 200
            assert reply.json() == {"id": rid, "object": "response", "deleted": True}
            del self.store[rid]
            self.deleted.append(rid)
        else:
            self._error(reply, 404, "response_not_found", None)

    @rule(data=st.data())
    def stored_cancel(self, data: st.DataObject) -> None:
        """HTTP-6, BG-6: cancel is 404 for unknown ids, response_not_cancellable for a response
        that did not run in the background, and the stored response for a finished one."""
        self.tally["rule cancel"] += 1
        rid = self._any_id(data)
        reply = self._request("POST", f"/v1/responses/{rid}/cancel")
        if rid in self.background_ids and rid in self.store:  # finished: unchanged (BG-6)
            assert reply.status == 200 and reply.json()["status"] in ("completed", "incomplete")
        elif rid in self.store:
            self._error(reply, 400, "response_not_cancellable", None)
        else:
            self._error(reply, 404, "response_not_found", None)

    @rule(
        data=st.data(),
        order=st.sampled_from([None, "asc", "desc", "sideways"]),
        limit=st.sampled_from([None, "1", "2", "20", "100", "0", "101", "x", "-1"]),
        after=st.sampled_from([None, "first", "unknown"]),
    )
    def stored_input_items(
        self, data: st.DataObject, order: str | None, limit: str | None, after: str | None
    ) -> None:
        """HTTP-6: pages of a stored response's input items."""
        self.tally["rule input_items"] += 1
        rid = self._any_id(data)
        query: dict[str, str] = {}
        if order is not None:
            query["order"] = order
        if limit is not None:
            query["limit"] = limit
        path = f"/v1/responses/{rid}/input_items"
        if rid not in self.store:
            reply = self._request("GET", path + _query(query))
            self._error(reply, 404, "response_not_found", None)
            return
        if order not in (None, "asc", "desc"):
            self._error(self._request("GET", path + _query(query)), 400, "invalid_value", "order")
            return
        if limit is not None and not (limit.isdigit() and 1 <= int(limit) <= 100):
            self._error(self._request("GET", path + _query(query)), 400, "invalid_value", "limit")
            return
        full = self._request("GET", f"{path}?order=asc&limit=100").json()
        ids = [item["id"] for item in full["data"]]
        assert len(ids) == self.store[rid].inputs and all(ids), full
        assert len(set(ids)) == len(ids), "listed item ids are unique"
        expected = ids if order == "asc" else ids[::-1]
        if after == "first":
            query["after"] = expected[0]
            expected = expected[1:]
        elif after == "unknown":
            query["after"] = "msg_unknown"
            expected = []
        size = int(limit) if limit is not None else 20
        reply = self._request("GET", path + _query(query))
        assert reply.status == 200, reply
        page = reply.json()
        assert set(page) == {"object", "data", "first_id", "last_id", "has_more"}, page
        assert page["object"] == "list"
        got = [item["id"] for item in page["data"]]
        assert got == expected[:size], (got, expected, size)
        assert page["first_id"] == (got[0] if got else None)
        assert page["last_id"] == (got[-1] if got else None)
        assert page["has_more"] == (len(expected) > size)

    # ================================================================== malformed requests
    @rule(
        data=st.data(),
        kind=st.sampled_from(
            ["invalid_json", "not_object", "wrong_field", "huge", "deep", "empty", "method",
             "path", "upgrade"]
        ),
    )  # fmt: skip
    def malformed(self, data: st.DataObject, kind: str) -> None:
        """§12 over HTTP: decoding errors, wrong methods and paths (ERR-2)."""
        self.tally["rule malformed"] += 1
        self.tally[f"malformed {kind}"] += 1
        if kind == "invalid_json":
            raw = data.draw(
                st.sampled_from(["{", '{"input": ', "nul", "{'a': 1}", "\xff", "0:", "[1,", "1 2"])
            )
            reply = self._request("POST", "/v1/responses", raw=raw)
            self._error(reply, 400, "invalid_json", None)
        elif kind == "not_object":
            raw = data.draw(st.sampled_from(["[]", "1", '"x"', "null", "true"]))
            reply = self._request("POST", "/v1/responses", raw=raw)
            self._error(reply, 400, "invalid_type", None)
        elif kind == "wrong_field":
            name, value, code, param = data.draw(st.sampled_from(WRONG_FIELDS))
            reply = self._request("POST", "/v1/responses", {"input": "x", name: value})
            self._error(reply, 400, code, param)
        elif kind == "huge":  # ~1 MB: an ignored unknown field (LEN-1), or a wrong type
            if data.draw(st.booleans()):
                body = {"input": "hi", "store": False, "padding": "p" * 1_000_000}
                reply = self._request("POST", "/v1/responses", body)
                assert reply.status == 200 and reply.json()["status"] == "completed"
            else:
                body = {"input": 7, "instructions": "i" * 1_000_000}
                self._error(
                    self._request("POST", "/v1/responses", body), 400, "invalid_type", "input"
                )
        elif kind == "deep":
            raw = '{"input":' + "[" * 10_000 + "]" * 10_000 + "}"
            reply = self._request("POST", "/v1/responses", raw=raw)
            self._error(reply, 400, "too_deeply_nested", None)
        elif kind == "empty":  # no body at all: not JSON
            self._error(self._request("POST", "/v1/responses", raw=""), 400, "invalid_json", None)
        elif kind == "method":  # §15 #12 says 400; the engine sends the real 405
            method, path = data.draw(
                st.sampled_from(
                    [("PUT", "/v1/responses"), ("PATCH", f"/v1/responses/{UNKNOWN}"),
                     ("POST", "/v1/models"), ("DELETE", "/healthz")]
                )
            )  # fmt: skip
            self._error(self._request(method, path), (400, 405), "method_not_allowed", None)
        elif kind == "path":
            path = data.draw(st.sampled_from(["/v2/responses", "/v1/nope", "/", "/v1/responses/"]))
            self._error(self._request("GET", path), 404, "not_found", None)
        else:  # GET /v1/responses without an upgrade (HTTP-1)
            reply = self._request("GET", "/v1/responses")
            self._error(reply, 400, "websocket_upgrade_required", None)

    # ================================================================== teardown
    # ================================================================== rules: background (BG-*)
    @rule(
        data=st.data(),
        text=user_texts,
        tools=st.lists(st.sampled_from(TOOL_NAMES), unique=True, max_size=3),
        then=st.sampled_from(["poll", "stream", "resume", "cancel", "create_streaming"]),
    )
    def background(self, data: st.DataObject, text: str, tools: list[str], then: str) -> None:
        """A background response (BG-1..BG-6): answered at once ``queued``, then polled,
        streamed from the start, resumed from any sequence number (the replay is exactly the
        tail), or cancelled (racing its end: ``cancelled`` or finished, never in_progress)."""
        self.tally["rule background"] += 1
        self.tally[f"background {then}"] += 1
        body = self._body(data, [message(text, "easy")], tools, then == "create_streaming")
        body["store"] = True  # BG-1; without it: the continue_response variant
        body["background"] = True
        reply = self._request("POST", "/v1/responses", body)
        assert reply.status == 200, (reply.status, reply.text[:300])
        if then == "create_streaming":
            final = self._sse(reply)
        else:
            created = reply.json()
            assert created["status"] == "queued" and created["background"] is True, created
            assert created["output"] == [] and created["usage"] is None
            final = self._background_follow(data, created["id"], then)
        assert final["background"] is True
        self.tally[f"background ended {final['status']}"] += 1
        if final["status"] == "cancelled":
            assert final["usage"] is not None, "BG-6: a cancelled run reports its usage"
            return
        self._check_result(body, final)
        stored = self.env.run(self.env.live.engine.store.hydrate(final["id"]))
        assert stored is not None and stored.record.response.status == final["status"], "BG-7"
        self.store[final["id"]] = Stored(final["id"], _unanswered(stored.items), 1)
        self.background_ids.add(final["id"])

    def _background_follow(self, data: st.DataObject, rid: str, then: str) -> dict[str, Any]:
        path = f"/v1/responses/{rid}"
        if then == "cancel":
            reply = self._request("POST", f"{path}/cancel")
            assert reply.status == 200, reply.text[:300]
            cancelled: dict[str, Any] = reply.json()
            assert cancelled["status"] in ("cancelled", "completed", "incomplete"), cancelled
            assert self._request("GET", path).json()["status"] == cancelled["status"]
            return cancelled
        if then == "poll":
            for _ in range(500):  # each request lets the run advance (BG-3)
                polled: dict[str, Any] = self._request("GET", path).json()
                assert polled["status"] in ("queued", "in_progress", "completed", "incomplete")
                if polled["status"] not in ("queued", "in_progress"):
                    return polled
            raise AssertionError(f"background response {rid} never finished")
        full = self._request("GET", f"{path}?stream=true")
        final = self._sse(full)  # BG-4: the whole run, from sequence number 0
        if then == "resume":  # BG-5: a replay after N is exactly the tail after N
            blocks = full.text[:-2].split("\n\n")
            after = data.draw(st.integers(-1, len(blocks)), label="starting_after")
            tail = self._request("GET", f"{path}?stream=true&starting_after={after}")
            assert tail.status == 200, tail.text[:300]
            expected = blocks[after + 1 :]
            assert (tail.text[:-2].split("\n\n") if tail.text else []) == expected
        return final

    def teardown(self) -> None:
        try:
            if not self.broken:
                _retire_parked(self)
                count = self.env.run(self.env.settle_tasks(self.baseline))
                assert count <= self.baseline, f"{count} tasks left, baseline {self.baseline}"
                assert self.env.run(self.env.open_sessions()) == 0
                stats = self._request("GET", "/debug/stats").json()
                assert stats["open_sessions"] == 0, "HTTP-5: every request's session is closed"
        finally:
            validate_recorded(self.recorded_start)


def _retire_parked(machine: HttpProtocolMachine) -> None:
    """A ``store: true`` response that ended on tool calls leaves its rollout parked: a bounded
    task the lot owns (PARK-4, PARK-7), not the request's. Deleting the response retires it
    (HYD-5), so after these deletes the lot is empty and the server runs no more tasks than
    before the machine started; any other task left is a leak (HTTP-5)."""
    for rid, stored in list(machine.store.items()):
        if stored.pending:
            reply = machine._request("DELETE", f"/v1/responses/{rid}")
            assert reply.status == 200, (reply.status, reply.text[:300])
    assert machine.env.run(_parked(machine.env)) == 0, "PARK-4: parked only behind a call"


async def _parked(env: LiveEnv) -> int:
    return len(env.live.engine.parking)


def _text(item: dict[str, Any]) -> str:
    content = item.get("content", "")
    if isinstance(content, str):
        return content
    return "\n".join(part.get("text", "") for part in content)


def _query(query: dict[str, str]) -> str:
    if not query:
        return ""
    from urllib.parse import urlencode

    return "?" + urlencode(query)


@pytest.fixture
def http_env(tmp_path: Path) -> Any:
    """The stored-response routes run against the embedded SQLite store (STORE-10)."""
    env = LiveEnv(EngineConfig(tokens_per_second=0), store=SqliteStore(tmp_path / "fuzz.db"))
    try:
        yield env
    finally:
        env.close()


@pytest.mark.timeout(timeout_for(120))
def test_http_protocol_state_machine(http_env: LiveEnv) -> None:
    machine = type("HttpMachine", (HttpProtocolMachine,), {"env": http_env, "tally": Counter()})
    run_state_machine_as_test(
        machine,
        settings=settings(max_examples=examples(ci=1.0, deep=0.2), stateful_step_count=30),
    )
    report("HttpProtocolMachine", machine.runs, machine.tally, http_env.live.engine.counters)
