"""An HTTP chain's rollout is parked between its creates (PARK-4, PARK-3, PARK-7, OWN-2).

A real server, the official SDK over HTTP (``store: true``, tool calls). Each create that ends on
a tool call leaves its rollout suspended and parked; the chain's next create resumes the very
same coroutine. The usage records (the post-inference ledger, the far side of billing) name one
rollout for the whole chain, one record per response. Nothing on the wire changes: a server with
parking off (the hydration cache or the store serves each create, HYD-1, COMPAT-4) gives the
same responses, whatever evicts the parked rollout.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

from engine.core import EngineConfig
from engine.server.transport.server_config import ServerConfig
from tests.support.server import LiveServer
from tests.support.wait import wait_for

TOOLS: list[Any] = [
    {"type": "function", "name": name, "parameters": {"type": "object", "properties": {}}}
    for name in ("list_dir", "read_file", "search", "edit_file", "run_tests")
]
MODEL = "sim-coding-agent"
KEYS = ServerConfig(api_keys=frozenset({"key-alice", "key-bob"}))
FAST = EngineConfig(tokens_per_second=0)
NOT_PARKED = EngineConfig(tokens_per_second=0, park_seconds=0)  # the paths before PARK-4
# One parked rollout fits the owner's part of the lot (0.3 x 0.25 x 800,000 = 60,000 bytes,
# each charged its context, its five tools included (MEM-10), plus 32 KiB, MEM-11: 40-47 KB),
# two never do (PARK-7, MEM-12, MEM-13).
SMALL = 800_000


def _answer(response: Any, text: str = "ok") -> list[Any]:
    call = response.output[-1]
    assert call.type == "function_call"
    return [{"type": "function_call_output", "call_id": call.call_id, "output": text}]


def _shape(response: Any) -> Any:
    """What a response says, without its ids (each server makes its own)."""
    items = [
        (item.type, getattr(item, "name", None), getattr(item, "arguments", None), item.status)
        for item in response.output
    ]
    return response.status, items, response.output_text, response.usage.model_dump()


async def _chain(
    client: AsyncOpenAI, turns: int, stream: bool = False, first: Any = None
) -> list[Any]:
    """A chain of ``turns`` creates by ``previous_response_id``, each answering the last call."""
    responses = [first or await _create(client, None, "Fix the tests.", stream)]
    for turn in range(1, turns):
        responses.append(
            await _create(client, responses[-1], _answer(responses[-1], f"t{turn}"), stream)
        )
    return responses


async def _create(client: AsyncOpenAI, previous: Any, input: Any, stream: bool = False) -> Any:
    prev = previous.id if previous is not None else openai.NOT_GIVEN
    if not stream:
        return await client.responses.create(
            model=MODEL, input=input, tools=TOOLS, previous_response_id=prev
        )
    events = await client.responses.create(
        model=MODEL, input=input, tools=TOOLS, previous_response_id=prev, stream=True
    )
    async for event in events:
        if event.type == "response.completed":
            return event.response
    raise AssertionError("no response.completed")


@pytest.mark.parametrize("stream", [False, True])
async def test_http_chain_resumes_its_parked_rollout(
    server_factory: Callable[..., Any], stream: bool
) -> None:
    """PARK-4, PARK-3: every continuation of an HTTP chain resumes the rollout its previous
    create left suspended, JSON and SSE alike: one rollout serves the whole chain (the usage
    records name it, one record per response, POST-1), the history is validated once, and the
    answers are those of a server without parking."""
    live: LiveServer = await server_factory(FAST)
    reference: LiveServer = await server_factory(NOT_PARKED)
    turns = 5
    async with (
        AsyncOpenAI(base_url=live.base_url, api_key="x", max_retries=0) as client,
        AsyncOpenAI(base_url=reference.base_url, api_key="x", max_retries=0) as other,
    ):
        chain = await _chain(client, turns, stream)
        expected = await _chain(other, turns, stream)
    assert [_shape(r) for r in chain] == [_shape(r) for r in expected]
    engine = live.engine
    assert engine.counters["create.unparked"] == engine.counters["create.fast_path"] == turns - 1
    assert engine.counters["create.hydrated"] == engine.counters["create.store_hydrate"] == 0
    assert reference.engine.counters["create.hydrated"] == turns - 1
    assert len(engine.parking) == 1  # the last response's rollout, suspended again
    await live.runner.cleanup()  # shutdown retires it: its end is accounted (PARK-2)
    records = list(engine.post.recent)
    assert [r.response_ids for r in records] == [[r.id] for r in chain]  # billed once each
    assert len({r.rollout_id for r in records}) == 1  # one coroutine served every response
    assert sum(r.stage_runs.get("validate.full", 0) for r in records) == 1


async def test_store_false_is_not_parked_over_http(server_factory: Callable[..., Any]) -> None:
    """PARK-4: a ``store: false`` HTTP response is continued by nobody (its rollout is retired
    as its request ends): its continuation is ``previous_response_not_found``, as before."""
    live: LiveServer = await server_factory(FAST)
    async with AsyncOpenAI(base_url=live.base_url, api_key="x", max_retries=0) as client:
        first = await client.responses.create(
            model=MODEL, input="Fix the tests.", tools=TOOLS, store=False
        )
        with pytest.raises(openai.BadRequestError) as refused:
            await client.responses.create(
                model=MODEL, previous_response_id=first.id, input=_answer(first), tools=TOOLS
            )
    assert refused.value.code == "previous_response_not_found"
    assert len(live.engine.parking) == 0 and live.engine.counters["park.parked"] == 0


async def test_a_fork_from_an_earlier_response_is_served_as_before(
    server_factory: Callable[..., Any],
) -> None:
    """PARK-4, COMPAT-4, HYD-1: a create naming an earlier response of the chain (not the one
    whose rollout is parked) forks from the store or the cache with the answer a server without
    parking gives; the chain's parked rollout is untouched and its next create resumes it."""
    live: LiveServer = await server_factory(FAST)
    reference: LiveServer = await server_factory(NOT_PARKED)
    async with (
        AsyncOpenAI(base_url=live.base_url, api_key="x", max_retries=0) as client,
        AsyncOpenAI(base_url=reference.base_url, api_key="x", max_retries=0) as other,
    ):
        chain, expected = await _chain(client, 3), await _chain(other, 3)
        fork = await _create(client, chain[0], _answer(chain[0], "forked"))
        expected_fork = await _create(other, expected[0], _answer(expected[0], "forked"))
        assert _shape(fork) == _shape(expected_fork)
        assert fork.previous_response_id == chain[0].id
        engine = live.engine
        assert engine.counters["create.unparked"] == 2
        assert engine.counters["create.store_hydrate"] + engine.counters["create.hydrated"] == 1
        more = await _create(client, chain[-1], _answer(chain[-1], "t3"))  # the chain goes on
        expected_more = await _create(other, expected[-1], _answer(expected[-1], "t3"))
    assert _shape(more) == _shape(expected_more)
    assert engine.counters["create.unparked"] == 3


async def test_concurrent_creates_on_one_id_resume_it_once(
    server_factory: Callable[..., Any],
) -> None:
    """PARK-3, PARK-4: two creates naming the same parked response at once: exactly one resumes
    the rollout; the other is served as any second continuation of a stored response (the
    hydration cache, or the store once the first has moved the context on, HYD-3). Both
    answers are the ones a server without parking gives."""
    live: LiveServer = await server_factory(FAST)
    reference: LiveServer = await server_factory(NOT_PARKED)
    async with (
        AsyncOpenAI(base_url=live.base_url, api_key="x", max_retries=0) as client,
        AsyncOpenAI(base_url=reference.base_url, api_key="x", max_retries=0) as other,
    ):
        first = await _create(client, None, "Fix the tests.")
        expected = await _create(other, None, "Fix the tests.")
        await wait_for(lambda: len(live.engine.parking) == 1)
        both = await asyncio.gather(
            _create(client, first, _answer(first, "a")), _create(client, first, _answer(first, "a"))
        )
        want = await _create(other, expected, _answer(expected, "a"))
    assert [_shape(r) for r in both] == [_shape(want)] * 2
    assert len({r.id for r in both}) == 2
    counters = live.engine.counters
    assert counters["create.unparked"] == counters["park.claimed"] == 1
    assert counters["create.hydrated"] + counters["create.store_hydrate"] == 1
    await live.runner.cleanup()
    records = list(live.engine.post.recent)
    assert len({r.rollout_id for r in records if r.response_ids[0] in {b.id for b in both}}) == 2


@pytest.mark.parametrize("cache", [None, 0], ids=["hydrated", "store"])
async def test_an_evicted_chain_falls_back_with_the_same_answers(
    server_factory: Callable[..., Any], cache: int | None
) -> None:
    """PARK-4, PARK-7, MEM-12: under a small ``--memory-budget`` two interleaved chains evict
    each other's parked rollout (oldest first); each continuation then takes the hydration
    cache (HYD-1) or, with that off, the store (COMPAT-4), with the same answers."""
    config = EngineConfig(tokens_per_second=0, memory_budget=SMALL, hydration_cache_bytes=cache)
    live: LiveServer = await server_factory(config)
    reference: LiveServer = await server_factory(dataclasses.replace(config, park_seconds=0))
    shapes: list[list[Any]] = []
    for server in (live, reference):
        async with AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0) as client:
            a = [await _create(client, None, "Fix the tests.")]
            b = [await _create(client, None, "Fix the tests.")]
            for turn in range(1, 3):
                for chain in (a, b):
                    chain.append(await _create(client, chain[-1], _answer(chain[-1], f"{turn}")))
        shapes.append([_shape(r) for r in a + b])
    assert shapes[0] == shapes[1]
    counters = live.engine.counters
    assert counters["park.evicted"] >= 4 and counters["create.unparked"] == 0
    path = "create.hydrated" if cache is None else "create.store_hydrate"
    assert counters[path] == 4
    assert reference.engine.counters[path] == 4


async def test_another_key_gets_not_found_and_the_owner_still_resumes_over_http(
    server_factory: Callable[..., Any],
) -> None:
    """OWN-2, PARK-4: another key naming an HTTP chain's parked response gets exactly
    ``previous_response_not_found`` (400, param ``previous_response_id``), as for an unknown
    id, and changes nothing: the owner's next create resumes the parked rollout."""
    live: LiveServer = await server_factory(FAST, server=KEYS)
    async with (
        AsyncOpenAI(base_url=live.base_url, api_key="key-alice", max_retries=0) as alice,
        AsyncOpenAI(base_url=live.base_url, api_key="key-bob", max_retries=0) as bob,
    ):
        first = await _create(alice, None, "Fix the tests.")
        assert len(live.engine.parking) == 1
        with pytest.raises(openai.BadRequestError) as refused:
            await _create(bob, first, _answer(first))
        assert refused.value.status_code == 400
        assert refused.value.code == "previous_response_not_found"
        assert refused.value.param == "previous_response_id"
        assert len(live.engine.parking) == 1
        resumed = await _create(alice, first, _answer(first))
    assert resumed.previous_response_id == first.id
    assert live.engine.counters["create.unparked"] == 1
