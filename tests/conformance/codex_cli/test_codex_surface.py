"""What Codex's Responses clients read besides the events (CODEX-21..CODEX-25): the upgrade and
HTTP headers, error frames carrying `status` and `headers`, and the connection age limit as the
retryable error Codex expects. Real server, aiohttp's WebSocket client and the openai SDK."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import aiohttp
import msgspec
import pytest
from openai import AsyncOpenAI, BadRequestError

from engine.core import EngineConfig
from engine.server.transport.codex_headers import OPENAI_MODEL, REASONING_INCLUDED
from engine.server.transport.server_config import ServerConfig
from protocol.codec import encode, error_event
from protocol.errors import TooManyRequests
from tests.support.oracle import sdk_parse
from tests.support.server import LiveServer

NONSENSE: Any = [{"type": "nonsense"}]  # no item type: refused before any answer


async def test_upgrade_headers(server: LiveServer) -> None:
    """CODEX-21: the 101 says reasoning is counted and names no model (no create has named
    one yet: a guess would read to Codex as a reroute); it never sends a models etag
    (CODEX-22)."""
    async with aiohttp.ClientSession() as http, http.ws_connect(server.ws_url) as ws:
        headers = ws._response.headers
        assert headers[REASONING_INCLUDED] == "true"
        assert OPENAI_MODEL not in headers and "x-models-etag" not in headers


async def test_http_answers_name_the_model(server: LiveServer) -> None:
    """CODEX-21: an HTTP create's answer (JSON and SSE) names the model it asked for, so Codex
    sees no reroute; a refusal carries neither header."""
    sdk = AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    try:
        raw = await sdk.responses.with_raw_response.create(model="sim", input="hi")
        assert raw.headers[OPENAI_MODEL] == "sim" and raw.headers[REASONING_INCLUDED] == "true"
        streamed = await sdk.responses.with_raw_response.create(
            model="sim", input="hi", stream=True
        )
        assert streamed.headers[OPENAI_MODEL] == "sim"
        async for _ in streamed.parse():
            pass
        with pytest.raises(BadRequestError) as refused:
            await sdk.responses.create(model="sim", input=NONSENSE)
        assert OPENAI_MODEL not in refused.value.response.headers
        assert REASONING_INCLUDED not in refused.value.response.headers
    finally:
        await sdk.close()


def test_error_frames_carry_status_and_headers() -> None:
    """CODEX-24: an error with response headers (a 429's `retry-after`, `x-ratelimit-*`) goes
    out as `status` plus a `headers` object of strings, the shape Codex maps back to an HTTP
    error (its `WrappedWebsocketErrorEvent`); one without headers has no `headers` key. The
    SDK's error event model still parses both."""
    err = TooManyRequests("rate_limit_exceeded", "Slow down.", None)
    err.headers = {"retry-after": "2", "x-ratelimit-remaining-requests": "0"}
    frame = msgspec.json.decode(encode(error_event(err)))
    assert frame["status"] == 429 and frame["headers"] == err.headers
    assert frame["error"]["code"] == "rate_limit_exceeded"
    sdk_parse(frame)  # the oracle (CONF-1) takes the extra key
    plain = msgspec.json.decode(encode(error_event(TooManyRequests("x", "y", None))))
    assert "headers" not in plain


async def test_connection_age_limit_is_the_retryable_error(
    server_factory: Callable[..., Any],
) -> None:
    """CODEX-23, WS-8: past the age limit the next create gets exactly the error Codex maps to
    a retry on a new connection (`error.code` `websocket_connection_limit_reached`, `status`
    400), then the socket closes with 1001; a new connection works."""
    live: LiveServer = await server_factory(EngineConfig(max_connection_age_s=0.0))
    create: dict[str, Any] = {"type": "response.create", "model": "sim", "input": "hi"}
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(live.ws_url) as ws:
            await ws.send_str(json.dumps(create))
            frame = json.loads(await ws.receive_str(timeout=10))
            closing = await ws.receive(timeout=10)
        assert frame["type"] == "error" and frame["status"] == 400
        assert frame["error"]["code"] == "websocket_connection_limit_reached"
        assert closing.type is aiohttp.WSMsgType.CLOSE and closing.data == 1001


@pytest.mark.parametrize("deflate", [True, False], ids=["default", "no-ws-deflate"])
async def test_permessage_deflate_is_accepted_unless_declined(
    server_factory: Callable[..., Any], deflate: bool
) -> None:
    """CODEX-25, WS-1: an upgrade offering permessage-deflate (Codex always does) gets it by
    default and a compressed socket works; `--no-ws-deflate` declines it, and the same client
    runs uncompressed."""
    live: LiveServer = await server_factory(server=ServerConfig(ws_deflate=deflate))
    create = {"type": "response.create", "model": "sim", "input": "hi", "store": False}
    async with aiohttp.ClientSession() as http, http.ws_connect(live.ws_url, compress=15) as ws:
        extension = ws._response.headers.get("Sec-WebSocket-Extensions", "")
        assert ("permessage-deflate" in extension) is deflate
        await ws.send_str(json.dumps(create))
        kinds: list[str] = []
        while not kinds or kinds[-1] != "response.completed":
            kinds.append(json.loads(await ws.receive_str(timeout=10))["type"])
        assert kinds[0] == "response.created"
