"""HYD-3, HYD-5, PARK-3: a hydration cache hit is served only if its entry is still current once
the store has confirmed the response (``still_stored``, one read of its head line on a shared
store). That read awaits the store, and in the meantime another create may move the cached
context on; the loader then takes the store path instead.

Made deterministic on a real redis-server, held with SIGSTOP while the read is in flight: an
HTTP create naming a response is stopped inside its store read, after its cache hit (the
``hydration.hit`` counter says it got there); the WebSocket that made the response resumes its
rollout on the fast path meanwhile (COMPAT-2: the cache entry, which shares that rollout's
context, is dropped, HYD-3); then Redis runs on. Nothing is mocked and nothing sleeps."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from typing import Any

import pytest
from openai import AsyncOpenAI

from engine.core import EngineConfig
from engine.store.redis import RedisStore
from tests.store._procs import RedisServer
from tests.support.fixtures import response_shape
from tests.support.server import LiveServer, start_server
from tests.support.wait import wait_for

TOOLS: list[Any] = [
    {"type": "function", "name": name, "parameters": {"type": "object", "properties": {}}}
    for name in ("list_dir", "read_file", "search", "edit_file", "run_tests")
]
MODEL = "sim-coding-agent"  # answers every turn with one more tool call


def _answer(response: Any, text: str) -> list[Any]:
    call = response.output[-1]
    assert call.type == "function_call"
    return [{"type": "function_call_output", "call_id": call.call_id, "output": text}]


async def _terminal(conn: Any) -> Any:
    async for event in conn:
        if event.type in ("response.completed", "response.failed", "error"):
            return event
    raise AssertionError("the socket closed before a terminal event")


@pytest.fixture
async def live(redis_server: RedisServer) -> AsyncIterator[LiveServer]:
    server = await start_server(
        EngineConfig(tokens_per_second=0), store=RedisStore(redis_server.url)
    )
    try:
        yield server
    finally:
        await server.runner.cleanup()


async def test_a_cache_hit_moved_on_during_its_store_read_takes_the_store_path(
    redis_server: RedisServer, live: LiveServer
) -> None:
    """HYD-3, HYD-5, COMPAT-4: the cache entry of response R is current when an HTTP create
    naming R finds it, and no longer once that create's store read of R returns (R's socket
    resumed its rollout meanwhile, moving the shared context on): the create is served from
    the store (``create.store_hydrate``), with the answer the socket's own continuation of R
    got for the same input, not from the moved-on context."""
    engine, counters = live.engine, live.engine.counters
    proc = redis_server.proc
    assert proc is not None
    socket = AsyncOpenAI(base_url=live.base_url, api_key="x", max_retries=0)
    http = AsyncOpenAI(base_url=live.base_url, api_key="x", max_retries=0)
    try:
        async with socket.responses.connect() as conn:
            await conn.response.create(model=MODEL, input="Fix the tests.", tools=TOOLS)
            first = (await _terminal(conn)).response
            assert first.id in engine.hydrated  # published, sharing the rollout's context
            hits = counters["hydration.hit"]
            proc.send_signal(signal.SIGSTOP)  # every store read and write waits from here
            try:
                racing = asyncio.create_task(
                    http.responses.create(
                        model=MODEL, input=_answer(first, "a"), tools=TOOLS,
                        previous_response_id=first.id,
                    )
                )  # fmt: skip
                await wait_for(lambda: racing.done() or counters["hydration.hit"] == hits + 1)
                assert not racing.done(), racing  # a cache hit, now in its store read (HYD-5)
                await conn.response.create(
                    model=MODEL, input=_answer(first, "a"), tools=TOOLS,
                    previous_response_id=first.id,
                )  # fmt: skip
                await wait_for(lambda: counters["create.fast_path"] == 1, "the socket's resume")
                assert first.id not in engine.hydrated  # its context moves on (HYD-3)
            finally:
                proc.send_signal(signal.SIGCONT)
            resumed = (await _terminal(conn)).response
        served = await racing
    finally:
        await socket.close()
        await http.close()
    assert resumed.previous_response_id == served.previous_response_id == first.id
    assert response_shape(served) == response_shape(resumed)
    assert counters["create.store_hydrate"] == 1 and counters["create.hydrated"] == 0
