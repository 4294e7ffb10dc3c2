"""Limits, auth and shutdown on a real server (AUTH-*, LIM-*, WS-13)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from engine.core import EngineConfig
from engine.models.base import TextDelta
from engine.models.router import Router
from engine.models.sim.scripted import ScriptedModel
from engine.server.transport.keys import SESSIONS
from engine.server.transport.server_config import ServerConfig, load_api_keys
from tests.support.server import LiveServer
from tests.support.wait import wait_for

KEY = "sk-test-key-123"


async def test_api_key_required_before_upgrade_and_on_http(
    server_factory: Callable[..., Any],
) -> None:
    live: LiveServer = await server_factory(server=ServerConfig(api_keys=frozenset({KEY})))
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.WSServerHandshakeError) as info:
            await http.ws_connect(live.ws_url)
        assert info.value.status == 401
        async with http.post(f"{live.base_url}/responses", json={"input": "hi"}) as resp:
            assert resp.status == 401
            body = await resp.json()
            assert body["error"]["code"] == "invalid_api_key"
        async with http.get(f"http://127.0.0.1:{live.port}/healthz") as resp:
            assert resp.status == 200  # health checks stay open
    good = AsyncOpenAI(base_url=live.base_url, api_key=KEY)
    assert (await good.responses.create(model="sim", input="hi")).status == "completed"
    async with good.responses.connect() as conn:
        await conn.response.create(model="sim", input="hi")
        async for event in conn:
            if event.type == "response.completed":
                break
    await good.close()
    bad = AsyncOpenAI(base_url=live.base_url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        await bad.responses.create(model="sim", input="hi")
    await bad.close()


def test_keys_load_from_file_and_env(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "keys"
    path.write_text("# comment\nk1\n\nk2  # trailing\n")
    monkeypatch.setenv("ROLLOUT_KEYS", "k3, k4")
    keys = load_api_keys(path, "ROLLOUT_KEYS")
    assert keys == {"k1", "k2", "k3", "k4"}
    config = ServerConfig(api_keys=keys)
    assert config.key_allowed("k3") and not config.key_allowed("k5") and not config.key_allowed("")


async def test_websocket_disabled_answers_426(server_factory: Callable[..., Any]) -> None:
    live: LiveServer = await server_factory(server=ServerConfig(websocket_enabled=False))
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.WSServerHandshakeError) as info:
            await http.ws_connect(live.ws_url)
        assert info.value.status == 426


async def test_connection_limit_answers_503_before_upgrade(
    server_factory: Callable[..., Any],
) -> None:
    """LIM-10, RETRY-1: past ``max_connections`` an upgrade is refused with 503 carrying
    ``x-should-retry: true`` (no work was done); a freed slot takes the next one."""
    live: LiveServer = await server_factory(server=ServerConfig(max_connections=2))
    async with aiohttp.ClientSession() as http:
        first = await http.ws_connect(live.ws_url)
        second = await http.ws_connect(live.ws_url)
        with pytest.raises(aiohttp.WSServerHandshakeError) as info:
            await http.ws_connect(live.ws_url)
        assert info.value.status == 503
        # it did no work, so it may be sent again, to any node (RETRY-1)
        assert info.value.headers is not None
        assert info.value.headers.get("x-should-retry") == "true"
        await first.close()
        sessions = live.runner.app[SESSIONS]
        await wait_for(lambda: len(sessions) < 2, "the closed socket's slot to free up")
        third = await http.ws_connect(live.ws_url)  # a slot freed up
        for ws in (second, third):
            await ws.close()


async def test_age_limit_errors_then_closes_reconnectably(
    server_factory: Callable[..., Any],
) -> None:
    live: LiveServer = await server_factory(
        EngineConfig(tokens_per_second=0, max_connection_age_s=0)
    )
    async with aiohttp.ClientSession() as http, http.ws_connect(live.ws_url) as ws:
        await ws.send_json({"type": "response.create", "input": "hi"})
        error = json.loads((await ws.receive(timeout=5)).data)
        assert error["error"]["code"] == "websocket_connection_limit_reached"
        assert "stream_id" not in error
        closing = await ws.receive(timeout=5)
        assert closing.type is aiohttp.WSMsgType.CLOSE
        assert ws.close_code == 1001  # the openai SDK reconnects on 1001


async def test_shutdown_lets_in_flight_response_finish_then_closes_1001(
    server_factory: Callable[..., Any],
) -> None:
    slow = ScriptedModel([[TextDelta("a"), 0.3, TextDelta("b")]])
    live: LiveServer = await server_factory(router=Router(routes={}, default=slow))
    async with aiohttp.ClientSession() as http, http.ws_connect(live.ws_url) as ws:
        await ws.send_json({"type": "response.create", "input": "hi"})
        first = json.loads((await ws.receive(timeout=5)).data)
        assert first["type"] == "response.created"
        shutdown = asyncio.create_task(live.runner.cleanup())
        types = []
        while True:
            msg = await ws.receive(timeout=5)
            if msg.type is not aiohttp.WSMsgType.TEXT:
                break
            types.append(json.loads(msg.data)["type"])
        await shutdown
        assert types[-1] == "response.completed"  # the in-flight response was not cut
        assert ws.close_code == 1001


async def test_slow_reader_is_disconnected_with_reason(server_factory: Callable[..., Any]) -> None:
    """A client that stops reading: backpressure, then a close after send_timeout (LIM-12)."""
    big = [TextDelta("x" * 60_000) for _ in range(400)]  # ~24 MB the client never reads
    live: LiveServer = await server_factory(
        router=Router(routes={}, default=ScriptedModel([big])),
        server=ServerConfig(send_timeout_s=0.5),
    )
    reader, writer = await asyncio.open_connection("127.0.0.1", live.port)
    writer.write(
        b"GET /v1/responses HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    await reader.readuntil(b"\r\n\r\n")
    payload = json.dumps({"type": "response.create", "input": "hi"}).encode()
    mask = b"\x00\x00\x00\x00"
    writer.write(bytes([0x81, 0x80 | 126]) + len(payload).to_bytes(2, "big") + mask + payload)
    await writer.drain()
    # we never read: the server must give up on us within its timeout
    await wait_for(lambda: live.engine.post.runs, "the slow reader's response to be accounted")
    writer.close()
    await live.engine.post.stop()
    (record,) = live.engine.post.recent
    assert record.status == "cancelled"  # the rollout stopped; nothing kept streaming


async def test_request_size_limits(server_factory: Callable[..., Any]) -> None:
    config = EngineConfig(tokens_per_second=0, max_input_items=3, max_input_chars=100)
    live: LiveServer = await server_factory(config)
    async with aiohttp.ClientSession() as http, http.ws_connect(live.ws_url) as ws:
        for body, code in (
            ({"input": [{"role": "user", "content": "x"}] * 4}, "too_many_items"),
            ({"input": "y" * 101}, "input_too_large"),
        ):
            await ws.send_json({"type": "response.create", **body})
            error = json.loads((await ws.receive(timeout=5)).data)
            assert (error["status"], error["error"]["code"]) == (400, code)
        await ws.send_json({"type": "response.create", "input": "fits"})
        while (event := json.loads((await ws.receive(timeout=5)).data))["type"] != (
            "response.completed"
        ):
            assert event["type"] != "error"
