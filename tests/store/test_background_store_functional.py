"""Background responses agree with the store (BG-10): when the terminal write fails, a poll, a
cancel and an SSE follower all learn that the response did not complete.

A real ``redis-server`` is the store. After the run is admitted (its ``in_progress`` record
written), the test revokes the ``SET`` command from the server's Redis user (``ACL SETUSER``),
so the terminal write fails at once with a real Redis error, and grants it back afterwards.
A scripted model with a gate holds the run until then.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import msgspec
import pytest
import redis.asyncio as aioredis
from openai import AsyncOpenAI

from engine.core import EngineConfig
from engine.models.base import TextDelta
from engine.models.router import Router
from engine.models.scripted import ScriptedModel
from engine.store.redis import RedisStore
from tests.store._procs import RedisServer
from tests.support.server import LiveServer, start_server


@pytest.fixture
async def gate() -> asyncio.Event:
    return asyncio.Event()


@pytest.fixture
async def live(redis_server: RedisServer, gate: asyncio.Event) -> AsyncIterator[LiveServer]:
    model = ScriptedModel([[TextDelta("Hello"), gate, TextDelta(" world")]])
    server = await start_server(
        EngineConfig(tokens_per_second=0),
        Router(routes={}, default=model),
        store=RedisStore(redis_server.url),
    )
    try:
        yield server
    finally:
        await server.runner.cleanup()


async def _acl(admin: aioredis.Redis, rule: str) -> None:
    """Grant or revoke a command for the server's Redis user (``default``)."""
    command: Any = admin.execute_command  # redis-py leaves it untyped
    await command("ACL", "SETUSER", "default", rule)


async def _follow(url: str) -> list[dict[str, Any]]:
    """Every SSE event of a background stream, decoded, until the server ends it."""
    events = []
    async with aiohttp.ClientSession() as http, http.get(url) as resp:
        assert resp.status == 200
        async for line in resp.content:
            if line.startswith(b"data: "):
                events.append(msgspec.json.decode(line[6:]))
    return events


async def test_a_failed_terminal_write_is_failed_everywhere(
    live: LiveServer, redis_server: RedisServer, gate: asyncio.Event
) -> None:
    client = AsyncOpenAI(base_url=live.base_url, api_key="x", max_retries=0)
    admin = aioredis.Redis.from_url(redis_server.url)
    try:
        created = await client.responses.create(model="m", input="hi", background=True)
        follower = asyncio.create_task(
            _follow(f"{live.base_url}/responses/{created.id}?stream=true")
        )
        polled = await client.responses.retrieve(created.id)
        while polled.status == "queued":  # opens at the first delta
            await asyncio.sleep(0.01)
            polled = await client.responses.retrieve(created.id)
        await _acl(admin, "-set")
        gate.set()
        events = await asyncio.wait_for(follower, 30)
        # The follower sees the store's refusal, not a silent end (nor a completion).
        assert events[-1]["type"] == "error"
        assert events[-1]["error"]["code"] == "store_unavailable"
        assert all(e["type"] != "response.completed" for e in events)
        # A poll and a cancel report it failed, never completed (before and after the store
        # takes writes again, in this process).
        failed = await client.responses.retrieve(created.id)
        assert failed.status == "failed" and failed.error is not None
        await _acl(admin, "+set")
        cancelled = await client.responses.cancel(created.id)
        assert cancelled.status == "failed"
        again = await client.responses.retrieve(created.id)
        assert again.status == "failed"
        # ... and the store agrees once it takes writes: the failed record is durable.
        record = await live.engine.store.get(created.id)
        assert record is not None and record.response.status == "failed"
    finally:
        await _acl(admin, "+set")
        await admin.aclose()
        await client.close()
