"""The per-process hydration cache (HYD-1..HYD-5) on a real server with the official SDK.

An HTTP chain by ``previous_response_id`` must, from its second turn on, run pre-inference only
over each request's new items: the stage counters prove it (``validate.full`` stays at the
first request's items; ``validate.incremental`` grows by exactly the new items). An HTTP chain
resumes its parked rollout first (PARK-4, ``retained/test_http_chain_park_functional.py``), so
the cache is seen here with parking off (``park_seconds=0``), as when the rollout was evicted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiohttp
import openai
from openai import AsyncOpenAI

from engine.core import EngineConfig
from tests.support.server import LiveServer

TOOLS: list[Any] = [
    {"type": "function", "name": name, "parameters": {"type": "object", "properties": {}}}
    for name in ("list_dir", "read_file", "search", "edit_file", "run_tests")
]
MODEL = "sim-coding-agent"
FIRST_INPUT: list[Any] = [
    {"role": "developer", "content": "You are careful."},
    {"role": "user", "content": "Fix the tests."},
]
NOT_PARKED = EngineConfig(tokens_per_second=0, park_seconds=0)  # PARK-4 off: the cache serves


def _answer(response: Any, text: str = "ok") -> list[Any]:
    call = response.output[-1]
    assert call.type == "function_call"
    return [{"type": "function_call_output", "call_id": call.call_id, "output": text}]


async def test_http_chain_runs_pre_inference_only_over_new_items(
    server_factory: Callable[..., Any],
) -> None:
    """HYD-1, HYD-4: every continuation is a cache hit, processed incrementally."""
    server: LiveServer = await server_factory(NOT_PARKED)
    client = AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    engine = server.engine
    response = await client.responses.create(model=MODEL, input=FIRST_INPUT, tools=TOOLS)
    full_items = engine.stats.items["validate.full"]
    assert full_items == len(FIRST_INPUT)
    turns = 5
    for turn in range(1, turns + 1):
        response = await client.responses.create(
            model=MODEL, previous_response_id=response.id, input=_answer(response), tools=TOOLS
        )
        assert engine.stats.items["validate.full"] == full_items  # the history: never again
        assert engine.stats.items["validate.incremental"] == turn  # one new item per request
        assert engine.stats.items["render.incremental"] == turn
    await client.close()
    counters = engine.counters
    assert counters["create.hydrated"] == counters["hydration.hit"] == turns
    assert counters["create.store_hydrate"] == counters["hydration.miss"] == 0
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{server.port}/metrics") as resp,
    ):
        body = await resp.text()
    assert f'rollout_events_total{{event="hydration.hit"}} {turns}.0' in body  # HYD-4


async def test_cache_off_is_the_store_path_with_the_same_answers(
    server_factory: Callable[..., Any],
) -> None:
    """HYD-2: with a zero budget nothing is cached; the store path re-processes the history
    (COMPAT-4) and the responses are the same."""
    live: LiveServer = await server_factory(
        EngineConfig(tokens_per_second=0, hydration_cache_bytes=0, park_seconds=0)
    )
    client = AsyncOpenAI(base_url=live.base_url, api_key="x", max_retries=0)
    first = await client.responses.create(model=MODEL, input=FIRST_INPUT, tools=TOOLS)
    second = await client.responses.create(
        model=MODEL, previous_response_id=first.id, input=_answer(first), tools=TOOLS
    )
    await client.close()
    engine = live.engine
    assert engine.counters["create.store_hydrate"] == 1
    assert engine.counters["hydration.miss"] == 1 and engine.counters["hydration.hit"] == 0
    # the stored history (2 inputs + the call) and then the new item, all on the full path
    assert engine.stats.items["validate.full"] == len(FIRST_INPUT) + 3 + 1
    assert second.output[-1].type == "function_call"


async def test_new_websocket_connection_continues_from_the_cache(
    server_factory: Callable[..., Any],
) -> None:
    """HYD-1: a new connection naming a recent stored response of this process forks the
    cached context, like an HTTP continuation."""
    server: LiveServer = await server_factory(NOT_PARKED)
    client = AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    first = await client.responses.create(model=MODEL, input=FIRST_INPUT, tools=TOOLS)
    async with client.responses.connect() as conn:
        await conn.response.create(
            model=MODEL, previous_response_id=first.id, input=_answer(first), tools=TOOLS
        )
        async for event in conn:
            assert event.type != "error", event
            if event.type == "response.completed":
                break
    await client.close()
    await server.runner.cleanup()  # shutdown ends its rollout (stats added)
    assert server.engine.counters["create.hydrated"] == 1
    assert server.engine.stats.items["validate.incremental"] == 1
    assert server.engine.stats.items["validate.full"] == len(FIRST_INPUT)


async def test_delete_invalidates_the_cache(server: LiveServer) -> None:
    """HYD-5: a deleted response is gone from the cache too: its continuation is not found."""
    client = AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    first = await client.responses.create(model=MODEL, input=FIRST_INPUT, tools=TOOLS)
    assert first.id in server.engine.hydrated
    await client.responses.delete(first.id)
    assert first.id not in server.engine.hydrated
    try:
        await client.responses.create(
            model=MODEL, previous_response_id=first.id, input=_answer(first), tools=TOOLS
        )
        raise AssertionError("a deleted response was continued")
    except openai.BadRequestError as err:
        assert err.code == "previous_response_not_found"
    finally:
        await client.close()


async def test_budget_is_in_bytes_and_evicts_least_recent(
    server_factory: Callable[..., Any],
) -> None:
    """HYD-2: the cache holds at most its byte budget; the oldest entries leave first, and a
    response larger than the whole budget is not cached at all."""
    live: LiveServer = await server_factory(
        EngineConfig(tokens_per_second=0, hydration_cache_bytes=40_000)
    )
    client = AsyncOpenAI(base_url=live.base_url, api_key="x", max_retries=0)
    # 40 small entries (~1.5 KiB each, the context's fixed part included) overflow 40 KB
    ids = [(await client.responses.create(model="sim", input=f"hi {n}")).id for n in range(40)]
    big = await client.responses.create(model="sim", input="word " * 20_000)
    await client.close()
    cache = live.engine.hydrated
    assert 0 < cache.nbytes <= 40_000
    assert ids[-1] in cache and ids[0] not in cache
    assert big.id not in cache
    assert live.engine.counters["hydration.evicted"] > 0


async def test_an_image_is_charged_its_bytes(server_factory: Callable[..., Any]) -> None:
    """HYD-2: an image counts what it holds, not a token estimate: a 300 KB data URL cannot sit in
    a 200 KB cache, though it renders as a handful of tokens."""
    live: LiveServer = await server_factory(
        EngineConfig(tokens_per_second=0, hydration_cache_bytes=200_000)
    )
    client = AsyncOpenAI(base_url=live.base_url, api_key="x", max_retries=0)
    image = "data:image/png;base64," + "A" * 300_000
    content: list[Any] = [
        {"type": "input_text", "text": "what is this?"},
        {"type": "input_image", "image_url": image, "detail": "low"},
    ]
    small = await client.responses.create(model="sim", input="hi")
    big = await client.responses.create(model="sim", input=[{"role": "user", "content": content}])
    await client.close()
    cache = live.engine.hydrated
    assert small.id in cache and big.id not in cache
    assert cache.nbytes <= 200_000
