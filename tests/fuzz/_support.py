"""Shared machinery of the fuzzers (not collected by pytest).

* ``LoopThread`` / ``LiveEnv``: a real server running on an event loop of its own in a thread,
  so hypothesis' synchronous (stateful) tests can drive it. Everything the fuzzers do on the
  wire runs as coroutines on that loop, submitted with ``env.run(...)``.
* ``StreamChecker``: a pure, per-connection checker of the server's event stream (ORD-1..ORD-8,
  EV-2, EV-3, ERR-1, WS-7). Feed it every frame in arrival order.
* ``check_error_body``: the error envelope rules shared by both transports (ERR-1..ERR-3).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import re
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp
from hypothesis import settings

from engine.core import EngineConfig
from engine.models.router import Router
from engine.server.transport.keys import SESSIONS
from engine.store import ResponseStore
from tests.support.oracle import RECORDED, sdk_parse
from tests.support.server import LiveServer, start_server

T = TypeVar("T")

# ----------------------------------------------------------------------------- profile scaling


def examples(ci: float = 1.0, deep: float = 1.0) -> int:
    """Examples for one fuzz test: a share of the active profile's ``max_examples`` (ci 60,
    dev 20, deep 10,000); ``deep`` is the share under the deep profile, where the live tests
    take a smaller share so that the whole deep run stays around 20-25 minutes."""
    share = deep if is_deep() else ci
    return max(5, int(settings().max_examples * share))


def is_deep() -> bool:
    return settings().max_examples >= 10_000


def timeout_for(ci_seconds: float) -> float:
    """pytest-timeout value for a fuzz test: bounded in ci/dev, none in the deep profile."""
    return 0 if is_deep() else ci_seconds


def report(name: str, runs: int, *tallies: Any) -> None:
    """What a fuzz test covered; shown with ``pytest -s`` (or in the captured output)."""
    lines = [f"{name}: {runs} sequences"]
    for tally in tallies:
        lines += [f"  {key}: {value}" for key, value in sorted(dict(tally).items())]
    print("\n" + "\n".join(lines))


# ----------------------------------------------------------------------------- loop thread


class LoopThread:
    """An asyncio loop running forever in a daemon thread; ``run`` submits a coroutine."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="fuzz-loop")
        self._thread.daemon = True
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise AssertionError(f"no answer from the server loop within {timeout} s") from None

    def close(self) -> None:
        async def cancel_the_rest() -> None:
            me = asyncio.current_task()
            rest = [t for t in asyncio.all_tasks() if t is not me]
            for task in rest:
                task.cancel()
            await asyncio.gather(*rest, return_exceptions=True)
            await asyncio.get_running_loop().shutdown_asyncgens()

        try:
            self.run(cancel_the_rest())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            self.loop.close()


class LiveEnv:
    """One real server (ephemeral loopback port) plus an HTTP client, on a loop thread."""

    def __init__(
        self,
        config: EngineConfig | None = None,
        router: Router | None = None,
        store: ResponseStore | None = None,
    ) -> None:
        self.thread = LoopThread()
        self.server: LiveServer | None = None
        self.http: aiohttp.ClientSession | None = None
        try:
            self.server = self.run(
                start_server(config or EngineConfig(tokens_per_second=0), router, store)
            )
            self.http = self.run(_client_session())
        except BaseException:
            self.close()
            raise

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        return self.thread.run(coro, timeout)

    @property
    def live(self) -> LiveServer:
        assert self.server is not None
        return self.server

    @property
    def client(self) -> aiohttp.ClientSession:
        assert self.http is not None
        return self.http

    def task_count(self) -> int:
        return self.run(_task_count())

    async def settle_tasks(self, baseline: int, within: float = 5.0) -> int:
        """Wait (in the loop) until no more tasks run than at ``baseline``; return the count."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        count = len(asyncio.all_tasks())
        while count > baseline and loop.time() < deadline:
            await asyncio.sleep(0.005)
            count = len(asyncio.all_tasks())
        return count

    async def open_sessions(self) -> int:
        return len(self.live.runner.app[SESSIONS])

    def close(self) -> None:
        try:
            if self.http is not None:
                self.run(self.http.close())
            if self.server is not None:
                self.run(self.server.runner.cleanup())
        finally:
            self.thread.close()


async def _client_session() -> aiohttp.ClientSession:
    # force_close: no keep-alive connection (and no server handler task) outlives a request, so
    # the server's task count is comparable before and after.
    connector = aiohttp.TCPConnector(force_close=True)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60))


async def _task_count() -> int:
    return len(asyncio.all_tasks())


def validate_recorded(start: int) -> None:
    """The conformance oracle (CONF-1) over everything the server sent since ``start``, then
    forget those frames so that long (deep) runs keep memory bounded."""
    from openai.types.responses import Response

    frames = RECORDED[start:]
    del RECORDED[start:]
    for raw in frames:
        parsed = sdk_parse(raw)
        if isinstance(parsed, dict):  # response.done: its snapshot must be a valid Response
            Response.model_validate(parsed["response"])


# ----------------------------------------------------------------------------- WebSocket client


class ConnectionLost(AssertionError):
    """The server closed the socket (or sent a non-text frame) when it should not have."""


class WsConn:
    """A raw WebSocket client connection (aiohttp), used from coroutines on the env loop."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws

    @classmethod
    async def open(cls, env: LiveEnv, headers: dict[str, str] | None = None) -> WsConn:
        ws = await env.client.ws_connect(
            env.live.ws_url, headers=headers or {}, max_msg_size=0, autoping=True
        )
        return cls(ws)

    async def send(self, event: Any) -> None:
        await self.ws.send_str(json.dumps(event))

    async def send_text(self, text: str) -> None:
        await self.ws.send_str(text)

    async def send_raw_text(self, data: bytes) -> None:
        """A text frame with arbitrary (possibly invalid UTF-8) payload."""
        await self.ws.send_frame(data, aiohttp.WSMsgType.TEXT)

    async def send_binary(self, data: bytes) -> None:
        await self.ws.send_bytes(data)

    async def recv(self, within: float = 10.0) -> dict[str, Any]:
        try:
            msg = await self.ws.receive(timeout=within)
        except TimeoutError:
            raise AssertionError(f"no event from the server within {within} s") from None
        if msg.type is not aiohttp.WSMsgType.TEXT:
            raise ConnectionLost(f"expected a text frame, got {msg.type!r} {msg.data!r}")
        event = json.loads(msg.data)
        assert isinstance(event, dict), f"a server event must be an object: {msg.data[:200]!r}"
        return event

    async def close(self) -> None:
        await self.ws.close()

    async def close_code(self, within: float = 10.0) -> int | None:
        """The server's close code, skipping any text frames before it."""
        while True:
            msg = await self.ws.receive(timeout=within)
            if msg.type is not aiohttp.WSMsgType.TEXT:
                await self.ws.close()
                return self.ws.close_code

    @property
    def closed(self) -> bool:
        return self.ws.closed


# ----------------------------------------------------------------------------- errors

_INTERNAL = re.compile(
    r"Traceback|File \"|\.py\b|Error\(|Exception\b|/work/|/usr/|site-packages|msgspec|aiohttp"
    r"|\b(?:[A-Z][a-z]+)+Error\b"
)
_ERROR_TYPES = {400: "invalid_request_error", 429: "rate_limit_error"}


def check_error_body(body: Any, status: int) -> dict[str, Any]:
    """``{"type","code","message","param"}`` (ERR-1, ERR-2) with no internal text (ERR-3)."""
    assert isinstance(body, dict), body
    assert set(body) == {"type", "code", "message", "param"}, f"error keys: {sorted(body)}"
    assert isinstance(body["code"], str) and body["code"], body
    assert isinstance(body["message"], str) and body["message"], body
    assert body["param"] is None or isinstance(body["param"], str), body
    assert not _INTERNAL.search(body["message"]), f"internal text in error: {body['message']!r}"
    if status >= 500:
        expected = "server_error"
    else:
        expected = _ERROR_TYPES.get(status, "invalid_request_error")
    assert body["type"] == expected, f"status {status} with error type {body['type']!r}"
    assert len(body["message"]) <= 1024, f"error message of {len(body['message'])} chars"
    return body


def check_error_event(event: dict[str, Any]) -> dict[str, Any]:
    """A WebSocket ``error`` event (ERR-1): int status, the body, no sequence_number (EV-3)."""
    assert set(event) <= {"type", "status", "error", "sequence_number", "stream_id"}, event
    status = event.get("status")
    assert isinstance(status, int) and not isinstance(status, bool), f"status {status!r}"
    assert 400 <= status <= 599, status
    assert "sequence_number" not in event, f"request-scoped error with a sequence number: {event}"
    if "stream_id" in event:
        assert isinstance(event["stream_id"], str), event
    return check_error_body(event["error"], status)


# ----------------------------------------------------------------------------- stream checker

TERMINAL = {
    "response.completed": "completed",
    "response.failed": "failed",
    "response.incomplete": "incomplete",
}


@dataclass
class OpenItem:
    item: dict[str, Any]
    output_index: int
    parts: int = 0
    pieces: list[str] = field(default_factory=list)
    text_done: str | None = None
    part_done: bool = False
    args_done: bool = False


@dataclass
class Tracked:
    """One response as seen on the wire."""

    id: str
    lane: str | None
    next_seq: int = 1
    phase: str = "created"  # created | in_progress | suspended | <terminal status>
    items: list[dict[str, Any]] = field(default_factory=list)
    step_calls: list[dict[str, Any]] = field(default_factory=list)  # calls since last suspension
    open: OpenItem | None = None
    suspensions: int = 0
    final: dict[str, Any] | None = None  # the terminal Response object
    events: int = 1

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL.values()


@dataclass
class Note:
    """What one event meant: ``kind`` in created/suspended/terminal/error/notice/output."""

    kind: str
    event: dict[str, Any]
    response: Tracked | None = None


class StreamChecker:
    """Checks one connection's event stream, frame by frame, for every response on it."""

    def __init__(self) -> None:
        self.open: dict[str | None, Tracked] = {}  # the running response of each lane
        self.by_id: dict[str, Tracked] = {}

    def live_response(self, response_id: str) -> Tracked | None:
        tracked = self.by_id.get(response_id)
        return tracked if tracked is not None and not tracked.terminal else None

    def feed(self, event: dict[str, Any]) -> Note:
        kind = event.get("type")
        assert isinstance(kind, str), event
        if "stream_id" in event:
            assert isinstance(event["stream_id"], str) and event["stream_id"], event
        if kind == "error":
            check_error_event(event)
            return Note("error", event)
        if kind.startswith("response.steer."):
            return self._steer(event)
        if kind.startswith("response.inject."):
            return self._inject(event)
        lane = event.get("stream_id")
        if kind == "response.created":
            return self._created(event, lane)
        tracked = self.open.get(lane)
        assert tracked is not None, f"{kind} on lane {lane!r} with no live response (ORD-7)"
        self._sequence(tracked, event)
        if kind == "response.in_progress":
            assert tracked.phase == "created" and event["sequence_number"] == 1, "ORD-1"
            self._same_response(tracked, event, "in_progress")
            tracked.phase = "in_progress"
            return Note("lifecycle", event, tracked)
        if kind in TERMINAL:
            return self._terminal(tracked, event, TERMINAL[kind])
        if kind == "response.done":
            return self._suspended(tracked, event)
        assert tracked.phase == "in_progress", f"{kind} while the response is {tracked.phase}"
        self._output(tracked, event, kind)
        return Note("output", event, tracked)

    # ------------------------------------------------------------------ lifecycle
    def _created(self, event: dict[str, Any], lane: str | None) -> Note:
        assert lane not in self.open, f"response.created on busy lane {lane!r} (WS-5)"
        assert event["sequence_number"] == 0, "ORD-3: response.created is sequence 0"
        response = event["response"]
        assert response["status"] == "in_progress" and response["output"] == [], response
        assert response["usage"] is None and "stream_id" not in response, "RESP-3/WS-7"
        assert response["id"] not in self.by_id, "response id reused"
        tracked = Tracked(id=response["id"], lane=lane)
        self.open[lane] = self.by_id[tracked.id] = tracked
        return Note("created", event, tracked)

    def _sequence(self, tracked: Tracked, event: dict[str, Any]) -> None:
        seq = event.get("sequence_number")
        assert seq == tracked.next_seq, (
            f"ORD-3: {event['type']} of {tracked.id} has sequence_number {seq}, "
            f"expected {tracked.next_seq}"
        )
        tracked.next_seq += 1
        tracked.events += 1

    @staticmethod
    def _same_response(tracked: Tracked, event: dict[str, Any], status: str) -> dict[str, Any]:
        response: dict[str, Any] = event["response"]
        assert response["id"] == tracked.id, "ORD-2: one response id per response"
        assert response["status"] == status, (event["type"], response["status"])
        assert "stream_id" not in response, "WS-7: stream_id never inside the Response"
        return response

    def _suspended(self, tracked: Tracked, event: dict[str, Any]) -> Note:
        assert tracked.phase == "in_progress" and tracked.open is None, "STATE-2"
        response = self._same_response(tracked, event, "in_progress")
        assert response["usage"] is None, "APPEND-2: usage null at a suspension"
        assert [o["id"] for o in response["output"]] == [i["id"] for i in tracked.items]
        assert response["output"] == tracked.items, "APPEND-2: snapshot = every item so far"
        pending = [{"call_id": c["call_id"], "name": c["name"]} for c in tracked.step_calls]
        assert event["pending_calls"] == pending, "APPEND-2: pending_calls = the step's calls"
        assert pending, "a suspension without calls"
        tracked.phase = "suspended"
        tracked.suspensions += 1
        tracked.step_calls = []
        return Note("suspended", event, tracked)

    def resumed(self, tracked: Tracked) -> None:
        """The client answered every pending call: the same response continues (APPEND-2)."""
        assert tracked.phase == "suspended"
        tracked.phase = "in_progress"

    def _terminal(self, tracked: Tracked, event: dict[str, Any], status: str) -> Note:
        assert tracked.phase in ("created", "in_progress", "suspended"), tracked.phase
        if status == "completed":
            assert tracked.open is None, "response.completed with an open item (STATE-2)"
        response = self._same_response(tracked, event, status)
        expected = list(tracked.items)
        if tracked.open is not None:  # ORD-8: the open item is kept, incomplete
            partial = response["output"][-1]
            assert partial["id"] == tracked.open.item["id"] and partial["status"] == "incomplete"
            if partial["type"] == "message":
                assert partial["content"][0]["text"] == "".join(tracked.open.pieces)
            else:
                assert partial["arguments"] == "".join(tracked.open.pieces)
            expected.append(partial)
        assert response["output"] == expected, "ORD-7: the terminal output is every item"
        usage = response["usage"]
        assert usage is not None, "RESP-3: usage at the terminal event"
        assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"], usage
        cached = usage["input_tokens_details"]["cached_tokens"]
        assert 0 <= cached <= usage["input_tokens"], usage
        assert response["completed_at"] is not None
        if status == "failed":
            assert response["error"]["code"] == "server_error"
        if status == "incomplete":
            reasons = ("max_output_tokens", "idle_timeout", "steered")
            assert response["incomplete_details"]["reason"] in reasons
        tracked.phase = status
        tracked.open = None
        tracked.final = response
        del self.open[tracked.lane]
        return Note("terminal", event, tracked)

    # ------------------------------------------------------------------ items
    def _output(self, tracked: Tracked, event: dict[str, Any], kind: str) -> None:
        if kind == "response.output_item.added":
            assert tracked.open is None, "ORD-5: an item was added while another is open"
            item = event["item"]
            assert event["output_index"] == len(tracked.items), "ORD-4: output_index"
            assert item["status"] == "in_progress"
            if item["type"] == "message":
                assert item["id"].startswith("msg_") and item["content"] == []
                assert item["role"] == "assistant"
            else:
                assert item["type"] == "function_call", item
                assert item["id"].startswith("fc_") and item["arguments"] == ""
                assert item["call_id"], item
            tracked.open = OpenItem(item=item, output_index=event["output_index"])
            return
        current = tracked.open
        assert current is not None, f"ORD-5: {kind} without an open item"
        assert event["output_index"] == current.output_index, f"ORD-4: {kind} output_index"
        item_type = current.item["type"]
        if kind != "response.output_item.done":
            assert event["item_id"] == current.item["id"], f"ORD-6: {kind} item_id"
        if kind.startswith(("response.content_part", "response.output_text")):
            assert item_type == "message", f"{kind} on a {item_type}"
            assert event["content_index"] == 0, "ORD-6: content_index is 0"
        if kind == "response.content_part.added":
            assert current.parts == 0 and event["part"]["text"] == ""
            current.parts = 1
        elif kind == "response.output_text.delta":
            assert current.parts == 1 and current.text_done is None
            current.pieces.append(event["delta"])
        elif kind == "response.output_text.done":
            assert current.parts == 1 and current.text_done is None
            assert event["text"] == "".join(current.pieces), "output_text.done text"
            current.text_done = event["text"]
        elif kind == "response.content_part.done":
            assert current.text_done is not None and not current.part_done
            assert event["part"]["text"] == current.text_done
            current.part_done = True
        elif kind == "response.function_call_arguments.delta":
            assert item_type == "function_call" and not current.args_done
            current.pieces.append(event["delta"])
        elif kind == "response.function_call_arguments.done":
            assert item_type == "function_call" and not current.args_done
            assert event["arguments"] == "".join(current.pieces)
            assert event["name"] == current.item["name"]
            current.args_done = True
        elif kind == "response.output_item.done":
            self._item_done(tracked, current, event["item"])
        else:
            raise AssertionError(f"unexpected event type {kind}")

    def _item_done(self, tracked: Tracked, current: OpenItem, item: dict[str, Any]) -> None:
        added = current.item
        assert item["id"] == added["id"] and item["type"] == added["type"], "ORD-6"
        assert item["status"] == "completed"
        joined = "".join(current.pieces)
        if item["type"] == "message":
            assert current.part_done, "ORD-5: message done before its part"
            assert [p["text"] for p in item["content"]] == [joined]
        else:
            assert current.args_done, "ORD-5: call done before its arguments"
            assert item["arguments"] == joined
            assert (item["call_id"], item["name"]) == (added["call_id"], added["name"])
            tracked.step_calls.append(item)
        tracked.items.append(item)
        tracked.open = None

    # ------------------------------------------------------------------ notices
    def _steer(self, event: dict[str, Any]) -> Note:
        """STEER-7, STEER-8: a notice for a live target takes that response's next sequence
        number and carries its lane, also after its terminal event (pending follows completed);
        a failure for a target that is not live carries 0, no lane and no steer id."""
        steer = event["steer"]
        if event["sequence_number"] == 0:
            assert event["type"] == "response.steer.failed", event
            assert "stream_id" not in event and "id" not in steer, event
            assert event["error"]["code"] in ("response_not_found", "response_already_completed")
            return Note("notice", event)
        tracked = self.by_id.get(steer["previous_response_id"])
        assert tracked is not None, f"a numbered steer notice for an unknown response: {event}"
        assert event.get("stream_id") == tracked.lane, "WS-7: steer notices carry the lane"
        if event["type"] != "response.steer.failed":
            assert steer["id"].startswith("steer_"), event
        self._sequence(tracked, event)
        return Note("notice", event, tracked)

    def _inject(self, event: dict[str, Any]) -> Note:
        """APPEND-5, INJECT-4, INJECT-6: an acknowledgement takes its target's next sequence
        number and carries its lane, also after a standard-mode target's terminal event; a
        failure for a target that takes no input carries 0 and no lane."""
        tracked = self.by_id.get(event["response_id"])
        if event["type"] == "response.inject.failed" and event["sequence_number"] == 0:
            tracked = None
        if tracked is None:  # a target that is not live: a detached notice (APPEND-5)
            assert event["type"] == "response.inject.failed", event
            assert event["sequence_number"] == 0 and "stream_id" not in event, event
            assert event["error"]["code"] in ("response_not_found", "response_already_completed")
            return Note("notice", event)
        assert event.get("stream_id") == tracked.lane, "WS-7: inject events carry the lane"
        self._sequence(tracked, event)
        return Note("notice", event, tracked)
