"""Per-key rate limits on a real server (RATE-1..RATE-6): the openai SDK reads the 429 and the
``x-ratelimit-*`` headers and retries after ``retry-after``; the WebSocket gets the same figures
as an error event and stays open; a second key is not touched by the first one's limits."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx2
import openai
import pytest
from openai import AsyncOpenAI

from engine.core import EngineConfig
from engine.server.transport.server_config import ServerConfig, load_api_keys, load_key_limits
from tests.support.server import LiveServer, start_server
from tests.support.wait import wait_for

KEY_A, KEY_B = "sk-flood", "sk-calm"
# Windows are aligned to the clock: with a day's window, no test's creates fall in two windows
# (but one started within seconds of midnight UTC).
DAY = 86400.0
GO_DURATION = re.compile(r"^(\d+h)?(\d+m)?(\d+(\.\d+)?s|\d+ms)$")


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def limited(**limits: Any) -> LiveServer:
    config = ServerConfig(api_keys=frozenset({KEY_A, KEY_B}), **{"rate_window_s": DAY, **limits})
    return await start_server(server=config)


@pytest.fixture
async def live() -> AsyncIterator[LiveServer]:
    """A has 2 requests a minute (its own line), B the default of 100."""
    server = await limited(rate_requests=100, key_limits={KEY_A: {"requests": 2}})
    try:
        yield server
    finally:
        await server.runner.cleanup()


def client(live: LiveServer, key: str, retries: int = 0, **kwargs: Any) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=live.base_url, api_key=key, max_retries=retries, **kwargs)


def test_keys_file_limits(tmp_path: Path) -> None:
    """RATE-1: a key line may carry its own limits; the key is the first field."""
    path = tmp_path / "keys"
    path.write_text("sk-a requests=5 tokens=900  # team a\nsk-b\nsk-c concurrent=2\n")
    assert load_api_keys(path, None) == {"sk-a", "sk-b", "sk-c"}
    own = load_key_limits(path)
    assert own == {"sk-a": {"requests": 5, "tokens": 900}, "sk-c": {"concurrent": 2}}
    config = ServerConfig(api_keys=frozenset(own), rate_tokens=7, key_limits=own)
    assert config.limits_for("sk-a").tokens == 900 and config.limits_for("sk-c").tokens == 7
    path.write_text("sk-a requests=lots\n")
    with pytest.raises(ValueError, match="key line 1") as caught:
        load_key_limits(path)
    assert "sk-a" not in str(caught.value)  # a key never reaches a message (RATE-1)


async def test_sdk_reads_429_and_headers(live: LiveServer) -> None:
    """RATE-3, RATE-5: each answer carries the figures; over the limit, 429
    ``rate_limit_exceeded`` with ``retry-after``, parsed by the SDK as ``RateLimitError``."""
    async with client(live, KEY_A) as flood, client(live, KEY_B) as calm_sdk:
        await flood_and_calm(live, flood, calm_sdk)


async def flood_and_calm(live: LiveServer, flood: AsyncOpenAI, calm_sdk: AsyncOpenAI) -> None:
    raw = await flood.responses.with_raw_response.create(model="sim", input="one")
    assert raw.headers["x-ratelimit-limit-requests"] == "2"
    assert raw.headers["x-ratelimit-remaining-requests"] == "1"
    assert GO_DURATION.match(raw.headers["x-ratelimit-reset-requests"])
    await flood.responses.create(model="sim", input="two")
    with pytest.raises(openai.RateLimitError) as caught:
        await flood.responses.create(model="sim", input="three")
    err = caught.value
    assert err.status_code == 429 and err.code == "rate_limit_exceeded"
    assert err.response.headers["x-ratelimit-remaining-requests"] == "0"
    assert 1 <= int(err.response.headers["retry-after"]) <= DAY
    calm = await calm_sdk.responses.with_raw_response.create(model="sim", input="hi")
    assert calm.headers["x-ratelimit-limit-requests"] == "100"  # B's own standing
    assert calm.headers["x-ratelimit-remaining-requests"] == "99"
    async with (  # every answer, not only creates (RATE-3)
        aiohttp.ClientSession() as http,
        http.get(f"{live.base_url}/models", headers=auth(KEY_A)) as resp,
    ):
        assert resp.headers["x-ratelimit-remaining-requests"] == "0"


async def test_sdk_retry_honours_retry_after() -> None:
    """RATE-5: the SDK's own retry waits out ``retry-after`` and then succeeds. A window of
    2 s keeps the wait short; a try whose two creates fell in two windows saw no 429 and is
    made again."""
    server = await limited(key_limits={KEY_A: {"requests": 1}}, rate_window_s=2.0)
    statuses: list[int] = []

    async def seen(response: httpx2.Response) -> None:
        statuses.append(response.status_code)

    http = httpx2.AsyncClient(event_hooks={"response": [seen]})
    try:
        sdk = client(server, KEY_A, retries=3, http_client=http)  # closed with ``http``
        for _ in range(5):
            statuses.clear()
            await sdk.responses.create(model="sim", input="first")
            await sdk.responses.create(model="sim", input="second")
            if 429 in statuses:
                break
        assert 429 in statuses and statuses[-1] == 200, statuses  # refused, waited, served
    finally:
        await http.aclose()
        await server.runner.cleanup()


async def test_background_create_is_refused_with_headers() -> None:
    """RATE-4, RATE-5: a ``background: true`` create passes the same check."""
    server = await limited(key_limits={KEY_A: {"requests": 1}})
    body = {"model": "sim", "input": "hi", "background": True, "store": True}
    try:
        async with aiohttp.ClientSession(headers=auth(KEY_A)) as http:
            statuses: list[int] = []
            refusal: dict[str, Any] = {}
            for _ in range(2):
                async with http.post(f"{server.base_url}/responses", json=body) as resp:
                    statuses.append(resp.status)
                    refusal = {"body": await resp.json(), "headers": resp.headers.copy()}
    finally:
        await server.runner.cleanup()
    assert statuses == [200, 429]
    headers = refusal["headers"]  # case-insensitive, as HTTP header names are
    assert refusal["body"]["error"]["code"] == "rate_limit_exceeded"
    assert headers["x-ratelimit-remaining-requests"] == "0" and int(headers["retry-after"]) >= 1


async def test_tokens_limit() -> None:
    """RATE-2: a response's tokens count when it ends; a key past its tokens is refused."""
    server = await limited(key_limits={KEY_A: {"tokens": 5}})
    try:
        async with client(server, KEY_A) as sdk:
            await spend_tokens(sdk)
    finally:
        await server.runner.cleanup()


async def spend_tokens(sdk: AsyncOpenAI) -> None:
    done = await sdk.responses.create(model="sim", input="count my tokens")
    assert done.usage is not None and done.usage.total_tokens >= 5
    with pytest.raises(openai.RateLimitError) as caught:
        await sdk.responses.create(model="sim", input="again")
    assert caught.value.response.headers["x-ratelimit-remaining-tokens"] == "0"
    assert caught.value.response.headers["x-ratelimit-limit-tokens"] == "5"


async def test_websocket_error_event_keeps_socket(live: LiveServer) -> None:
    """RATE-3, RATE-5: the upgrade carries the figures; over the limit the WebSocket gets an
    error event with status 429 and the HTTP headers in ``headers``, and stays open."""
    create = json.dumps({"type": "response.create", "model": "sim", "input": "hi"})
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(live.ws_url, headers=auth(KEY_A)) as ws,
    ):
        assert ws._response.headers["x-ratelimit-limit-requests"] == "2"
        assert ws._response.headers["x-ratelimit-remaining-requests"] == "2"
        errors: list[dict[str, Any]] = []
        completed = 0
        for _ in range(4):
            await ws.send_str(create)
            while True:
                event = json.loads(await ws.receive_str(timeout=30))
                if event["type"] == "response.completed":
                    completed += 1
                    break
                if event["type"] == "error":
                    errors.append(event)
                    break
        assert completed == 2 and len(errors) == 2  # the socket answered both refusals
        error = errors[0]
        assert error["status"] == 429
        assert error["error"]["code"] == "rate_limit_exceeded"
        assert error["error"]["type"] == "rate_limit_error"
        assert error["headers"]["x-ratelimit-remaining-requests"] == "0"
        assert int(error["headers"]["retry-after"]) >= 1


async def test_codex_gets_rate_limit_event(live: LiveServer) -> None:
    """RATE-6: a Codex client (``originator: codex_…``) hears ``codex.rate_limits`` before the
    429 error, with the requests window as ``primary``."""
    create = json.dumps({"type": "response.create", "model": "sim", "input": "hi"})
    headers = {**auth(KEY_A), "originator": "codex_cli_rs"}
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(live.ws_url, headers=headers) as ws,
    ):
        events: list[dict[str, Any]] = []
        while not any(e["type"] == "error" for e in events):
            await ws.send_str(create)
            while (event := json.loads(await ws.receive_str(timeout=30)))["type"] not in (
                "response.completed",
                "error",
            ):
                events.append(event)
            events.append(event)
    kinds = [e["type"] for e in events]
    assert kinds[-2:] == ["codex.rate_limits", "error"]
    limits = events[-2]["rate_limits"]
    assert limits["limit_reached"] is True and limits["allowed"] is False
    assert limits["primary"]["used_percent"] == 100.0
    assert limits["primary"]["window_minutes"] == 1440


async def test_concurrent_limit() -> None:
    """RATE-4: a response in progress holds its key's slot; the slot is back at its end (here:
    the client leaves mid-stream). The simulator at 5 tokens/s keeps the first one going."""
    config = ServerConfig(api_keys=frozenset({KEY_A}), key_limits={KEY_A: {"concurrent": 1}})
    server = await start_server(EngineConfig(tokens_per_second=5), server=config)
    try:
        async with client(server, KEY_A) as sdk:
            await hold_slot(sdk, server)
    finally:
        await server.runner.cleanup()


async def hold_slot(sdk: AsyncOpenAI, server: LiveServer) -> None:
    stream = await sdk.responses.create(model="sim", input="hold", stream=True)
    first = await anext(aiter(stream))  # admitted and streaming: the slot is taken
    assert first.type == "response.created"
    with pytest.raises(openai.RateLimitError) as caught:
        await sdk.responses.create(model="sim", input="second", max_output_tokens=16)
    assert "concurrent" in caught.value.message
    await stream.close()

    async def admitted() -> bool:
        try:
            await sdk.responses.create(model="sim", input="after", max_output_tokens=16)
        except openai.RateLimitError:
            return False
        return True

    await wait_for(admitted, "the slot back once the first response ended")


async def test_unlimited_server_sends_no_headers() -> None:
    """RATE-1: with no limit configured nothing is counted or sent."""
    server = await start_server()
    try:
        async with client(server, "any") as sdk:
            raw = await sdk.responses.with_raw_response.create(model="sim", input="hi")
        assert not any(name.startswith("x-ratelimit") for name in raw.headers)
    finally:
        await server.runner.cleanup()
