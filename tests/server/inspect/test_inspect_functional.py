"""The inspector's page, feed, auth and read model on a real server (INSP-1..INSP-8)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from engine.conversation.pipeline import TurnLog
from engine.observe.turnlog import MAX_TURNS, TurnHistory, TurnRecord
from engine.server.routes.inspector import COOKIE, FEED
from engine.server.transport.keys import INSPECTOR
from engine.server.transport.server_config import ServerConfig
from tests.support.server import LiveServer
from tests.support.tools import WEATHER
from tests.support.wait import wait_for
from tests.support.ws import read_until

KEY = "sk-inspect-test"


def root(live: LiveServer) -> str:
    return f"http://127.0.0.1:{live.port}"


async def next_snapshot(ws: aiohttp.ClientWebSocketResponse, **want: Any) -> dict[str, Any]:
    """The first snapshot whose totals include ``want`` (the feed samples at 2 Hz)."""
    while True:
        message = await ws.receive_json(timeout=10)
        if message["type"] == "snapshot" and all(
            message["totals"].get(k) == v for k, v in want.items()
        ):
            return message


async def suspend_on_lanes(ws: aiohttp.ClientWebSocketResponse, lanes: list[str]) -> list[Any]:
    """One tool-calling create per lane; returns each lane's completed response."""
    for lane in lanes:
        await ws.send_json(
            {
                "type": "response.create",
                "model": "gpt-x",
                "input": "Weather in Paris?",
                "tools": [WEATHER],
                "store": False,
                "stream_id": lane,
            }
        )
    return [(await read_until(ws, "response.completed"))[-1]["response"] for _ in lanes]


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def test_open_server_serves_page_and_feed(server: LiveServer, http: Any) -> None:
    """INSP-1: a self-contained HTML page; INSP-3: the feed sends snapshots."""
    async with http.get(f"{root(server)}/inspect") as resp:
        assert resp.status == 200
        assert resp.content_type == "text/html"
        assert "connect-src 'self'" in resp.headers["Content-Security-Policy"]
        page = await resp.text()
    assert "/inspect/feed" in page and "<script>" in page and "src=" not in page
    async with http.ws_connect(f"ws://127.0.0.1:{server.port}/inspect/feed") as ws:
        snapshot = await next_snapshot(ws)
    assert snapshot["totals"]["connections"] == 0
    assert snapshot["sections"]["store"]["backend"] == "memory"
    assert snapshot["sections"]["store"]["available"] is True


async def test_keys_guard_page_and_feed(server_factory: Any, http: Any) -> None:
    """INSP-2, AUTH-13: the API's keys apply; a browser signs in with the login form (the key in
    a POST body, a session token in an HttpOnly cookie, AUTH-14), never with a key in the URL."""
    live = await server_factory(server=ServerConfig(api_keys=frozenset({KEY})))
    base, feed = root(live), f"ws://127.0.0.1:{live.port}/inspect/feed"
    for url in (f"{base}/inspect", f"{base}/inspect?key={KEY}"):
        async with http.get(url, allow_redirects=False) as resp:
            assert resp.status == 401 and resp.content_type == "text/html"
            assert 'action="/inspect/login"' in await resp.text()  # the form, not the page
            assert COOKIE not in resp.cookies
    async with http.get(f"{base}/inspect/feed") as resp:
        assert resp.status == 401
        assert (await resp.json())["error"]["code"] == "invalid_api_key"
    async with http.get(f"{base}/v1/models?key={KEY}") as resp:
        assert resp.status == 401  # a query key is nobody's key
    login, origin = f"{base}/inspect/login", {"Origin": base}
    async with http.post(
        login, data={"key": "wrong"}, headers=origin, allow_redirects=False
    ) as resp:
        assert resp.status == 401 and COOKIE not in resp.cookies
    async with http.post(login, data={"key": KEY}, headers=origin, allow_redirects=False) as resp:
        assert resp.status == 303 and resp.headers["Location"] == "/inspect"
        cookie = resp.cookies[COOKIE]
    assert cookie["httponly"] and cookie["path"] == "/inspect"
    assert cookie["samesite"] == "Strict"
    cookies = {"Cookie": f"{COOKIE}={cookie.value}"}
    async with http.get(f"{base}/inspect", headers=cookies) as resp:
        assert resp.status == 200
    async with http.ws_connect(feed, headers=cookies) as ws:
        assert (await next_snapshot(ws))["type"] == "snapshot"
    async with http.ws_connect(feed, headers={"Authorization": f"Bearer {KEY}"}) as ws:
        assert (await next_snapshot(ws))["type"] == "snapshot"


async def test_feed_refuses_other_origins(server: LiveServer, http: Any) -> None:
    """INSP-2: a page on another site cannot open the feed with the operator's cookie."""
    url = f"ws://127.0.0.1:{server.port}/inspect/feed"
    with pytest.raises(aiohttp.WSServerHandshakeError) as info:
        await http.ws_connect(url, headers={"Origin": "http://evil.example"})
    assert info.value.status == 403
    same = {"Origin": f"http://127.0.0.1:{server.port}"}
    async with http.ws_connect(url, headers=same) as ws:
        assert (await next_snapshot(ws))["type"] == "snapshot"


async def test_suspended_rollouts_rows_cap_and_turns(server: LiveServer, http: Any) -> None:
    """INSP-4: suspended rollouts with their pending calls, capped rows with full counts;
    INSP-5: a rollout's turn history on request."""
    server.runner.app[INSPECTOR].row_cap = 2
    async with http.ws_connect(server.ws_url) as api:
        responses = await suspend_on_lanes(api, ["a", "b", "c"])
        async with http.ws_connect(f"ws://127.0.0.1:{server.port}/inspect/feed") as ws:
            snapshot = await next_snapshot(ws, suspended=3)
            assert len(snapshot["rollouts"]) == 2 and snapshot["totals"]["connections"] == 1
            (connection,) = snapshot["connections"]
            assert connection["lanes_n"] == 3 and connection["frames_in"] == 3
            assert connection["frames_out"] > 3
            row = snapshot["rollouts"][0]
            calls = {r["id"]: r["output"][0] for r in responses}
            call = calls[row["response_id"]]
            assert row["state"] == "suspended" and row["lane"] in ("a", "b", "c")
            assert row["pending"] == [{"call_id": call["call_id"], "name": "get_weather"}]
            assert row["tokens"] > 0 and row["idle_s"] is not None and row["turns"] == 1
            await ws.send_json({"type": "turns", "rollout_id": row["id"]})
            answer = await _turns_answer(ws)
    (turn,) = answer["turns"]
    assert answer["found"] and turn["response_id"] == row["response_id"]
    assert turn["calls"] == ["get_weather"] and turn["finish"] == "tool_calls"
    assert turn["rendered_tokens"] == turn["prompt_tokens"] > 0 and turn["output_tokens"] > 0


async def _turns_answer(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
    return (await read_until(ws, "turns"))[-1]


async def test_ended_rollout_keeps_its_turns(server: LiveServer, http: Any) -> None:
    """INSP-5: a rollout the sampler saw end stays listed (bounded) with its turn history."""
    async with (
        http.ws_connect(server.ws_url) as api,
        http.ws_connect(f"ws://127.0.0.1:{server.port}/inspect/feed") as ws,
    ):
        (first,) = await suspend_on_lanes(api, ["a"])
        rollout_id = (await next_snapshot(ws, suspended=1))["rollouts"][0]["id"]
        call = first["output"][0]
        output = {"type": "function_call_output", "call_id": call["call_id"], "output": "sun"}
        await api.send_json(
            {
                "type": "response.create",
                "model": "gpt-x",
                "previous_response_id": first["id"],
                "input": [output],
                "tools": [WEATHER],
                "store": False,
                "stream_id": "a",
            }
        )
        while True:
            snapshot = await next_snapshot(ws, suspended=0)
            if snapshot["ended"]:
                break
        (ended,) = snapshot["ended"]
        assert ended["id"] == rollout_id and ended["status"] == "completed"
        assert ended["turns"] == 2
        await ws.send_json({"type": "turns", "rollout_id": rollout_id})
        answer = await _turns_answer(ws)
    assert [t["finish"] for t in answer["turns"]] == ["tool_calls", "stop"]
    second = answer["turns"][1]
    # The continuation rendered only its new item (the fast path): less than its prompt.
    assert 0 < second["rendered_tokens"] < second["prompt_tokens"]


async def test_recent_errors(server: LiveServer, http: Any) -> None:
    """INSP-6: request errors of both transports land in the bounded ring."""
    async with http.ws_connect(server.ws_url) as api:
        await api.send_json(
            {"type": "response.create", "model": "m", "input": "hi", "previous_response_id": "x"}
        )
        assert (await api.receive_json(timeout=10))["type"] == "error"
    async with http.get(f"{server.base_url}/responses/resp_nothing") as resp:
        assert resp.status == 404
    async with http.ws_connect(f"ws://127.0.0.1:{server.port}/inspect/feed") as ws:
        snapshot = await next_snapshot(ws)
    notes = {(e["source"], e["code"]) for e in snapshot["errors"]}
    assert ("ws", "previous_response_not_found") in notes
    assert ("http", "response_not_found") in notes


async def test_sampler_runs_only_while_watched(server: LiveServer, http: Any) -> None:
    """INSP-3: no viewer, no sampling; one sampler however many viewers."""
    inspector, feed = server.runner.app[INSPECTOR], server.runner.app[FEED]
    url = f"ws://127.0.0.1:{server.port}/inspect/feed"
    async with http.ws_connect(url) as one, http.ws_connect(url) as two:
        first, second = await next_snapshot(one), await next_snapshot(two)
        assert len(feed.viewers) == 2
    assert first["t"] <= second["t"]
    assert feed._task is not None
    await asyncio.wait_for(feed._task, 10)  # the sampler stops once the last viewer left
    assert not feed.viewers
    before = inspector.samples
    # No sampler task is left to tick: nothing samples until a viewer comes back.
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "inspect-feed"]
    assert inspector.samples == before


async def test_bad_feed_request_is_answered(server: LiveServer, http: Any) -> None:
    async with http.ws_connect(f"ws://127.0.0.1:{server.port}/inspect/feed") as ws:
        await ws.send_str("[1]")
        while (message := await ws.receive_json(timeout=10))["type"] == "snapshot":
            pass
        assert message["type"] == "error"
        await ws.send_json({"type": "turns", "rollout_id": "rollout_unknown"})
        answer = await _turns_answer(ws)
    assert answer["found"] is False and answer["turns"] == []


def test_turn_history_is_bounded() -> None:
    """INSP-5: the per-rollout log keeps the newest MAX_TURNS steps and counts all."""
    history, log = TurnHistory(), TurnLog()
    for n in range(MAX_TURNS + 5):
        log.add_time("render", 0.001)
        history.add(
            TurnRecord(
                index=history.next_index(),
                response_id=f"resp_{n}",
                started_at=0.0,
                rendered_tokens=1,
                prompt_tokens=1,
                output_tokens=1,
                calls=(),
                finish="stop",
                pre_seconds=history.pre_seconds(log),
                ttft_seconds=None,
                model_seconds=0.0,
            )
        )
    assert history.count == MAX_TURNS + 5 and len(history.turns) == MAX_TURNS
    assert history.turns[0].index == 6
    # One shared log (append mode): each step is charged only its own pre-inference time.
    assert all(abs(t.pre_seconds - 0.001) < 1e-9 for t in history.turns)


async def test_viewers_are_capped(server_factory: Any, http: Any) -> None:
    """LIM-23: past ``max_inspector_viewers`` open feeds, the upgrade is refused with 503
    ``too_many_viewers``; a viewer that leaves frees its place."""
    live: LiveServer = await server_factory(server=ServerConfig(max_inspector_viewers=2))
    url = f"ws://127.0.0.1:{live.port}/inspect/feed"
    first = await http.ws_connect(url)
    second = await http.ws_connect(url)
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await http.ws_connect(url)
    assert refused.value.status == 503
    async with http.get(url.replace("ws://", "http://"), headers=_UPGRADE) as resp:
        body = await resp.json()
    assert resp.status == 503 and body["error"]["code"] == "too_many_viewers"
    await first.close()
    feed = live.runner.app[FEED]
    await wait_for(lambda: len(feed.viewers) < 2, "the server noticed the close")
    third = await http.ws_connect(url)
    await third.close()
    await second.close()


_UPGRADE = {
    "Connection": "Upgrade",
    "Upgrade": "websocket",
    "Sec-WebSocket-Version": "13",
    "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
}
