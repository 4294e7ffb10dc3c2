"""An HTTP chain's parked rollout across nodes (PARK-4, PARK-20, PARK-9, PARK-3): two ``rollout
serve`` nodes sharing one real redis-server (the launcher's ``Cluster``), the openai SDK over
HTTP straight to each node. A chain's create on node A that ends on a tool call parks its
rollout on A, with no address registered for other nodes; its continuation sent to node B is
served from the store with the answer A would have given, and A retires its parked copy on the
store's notice, so a later continuation of that response on A resumes no stale rollout."""

from __future__ import annotations

from typing import Any

import openai
import redis.asyncio as aioredis
from openai import AsyncOpenAI

from cli.launcher import Cluster
from engine.store.redis import PARKED_PREFIX
from tests.cluster.conftest import node_stats, node_url
from tests.support.fixtures import response_shape
from tests.support.tools import WEATHER
from tests.support.wait import wait_for

TOOLS: list[Any] = [
    {"type": "function", "name": name, "parameters": {"type": "object", "properties": {}}}
    for name in ("list_dir", "read_file", "search", "edit_file", "run_tests")
]
MODEL = "sim-coding-agent"  # answers every turn with one more tool call: each one suspends
A, B = 0, 1


def _answer(response: Any, text: str) -> list[Any]:
    call = response.output[-1]
    assert call.type == "function_call"
    return [{"type": "function_call_output", "call_id": call.call_id, "output": text}]


async def _create(client: AsyncOpenAI, previous: Any, input: Any) -> Any:
    prev = previous.id if previous is not None else openai.NOT_GIVEN
    return await client.responses.create(
        model=MODEL, input=input, tools=TOOLS, previous_response_id=prev
    )


def _count(stats: dict[str, Any], name: str) -> int:
    return int(stats.get("counters", {}).get(name, 0))


async def _suspend_on_socket(url: str) -> str:
    """A WebSocket create that ends on a tool call, then the socket closes: parked with its
    address registered (PARK-1, PARK-20). Its id."""
    sdk = AsyncOpenAI(base_url=url, api_key="x", max_retries=0)
    try:
        async with sdk.responses.connect() as conn:
            await conn.response.create(model="gpt-x", input="Weather in Paris?", tools=[WEATHER])
            async for event in conn:
                if event.type == "response.completed":
                    return str(event.response.id)
    finally:
        await sdk.close()
    raise AssertionError("no response.completed")


async def test_an_http_chain_parked_on_one_node_continues_on_the_other(
    haproxy_cluster: Cluster,
) -> None:
    """PARK-4, PARK-20, PARK-9, PARK-3: a chain of two HTTP creates on node A (the second
    resumes the rollout the first parked, ``create.unparked``) leaves its rollout parked on A
    with no address in the store for other nodes (a socket's rollout parked after it has one).
    The chain's next create, sent to node B, is served from the store (``create.store_hydrate``
    on B) with the answer the same chain gets when it stays on A; A retires its parked copy on
    B's notice (``park.continued_elsewhere``), so the same continuation sent to A later is
    served from A's cache or the store, the same answer again, and resumes nothing there."""
    cluster = haproxy_cluster
    redis = aioredis.Redis.from_url(cluster.spec.store)
    a = AsyncOpenAI(base_url=node_url(cluster, A), api_key="x", max_retries=0)
    b = AsyncOpenAI(base_url=node_url(cluster, B), api_key="x", max_retries=0)
    try:
        # The reference: a chain of three creates that stays on A, each resuming the last.
        kept = [await _create(a, None, "Fix the tests.")]
        for turn in (1, 2):
            kept.append(await _create(a, kept[-1], _answer(kept[-1], f"t{turn}")))
        # The chain that moves: two creates on A, then its third on B.
        first = await _create(a, None, "Fix the tests.")
        second = await _create(a, first, _answer(first, "t1"))
        stats = await node_stats(cluster)
        assert _count(stats[A], "create.unparked") == 3  # kept's two and second
        assert stats[A]["parked"] == 2 and stats[B]["parked"] == 0  # kept[-1]'s and second's
        socket = await _suspend_on_socket(node_url(cluster, A))  # registered (PARK-20) ...
        await wait_for(lambda: redis.exists(PARKED_PREFIX + socket), "the socket's address")
        for chain in (second.id, kept[-1].id):  # ... after the chains, which are not
            assert await redis.exists(PARKED_PREFIX + chain) == 0, chain
        moved = await _create(b, second, _answer(second, "t2"))
        assert moved.previous_response_id == second.id
        assert response_shape(moved) == response_shape(kept[-1])

        async def retired() -> list[dict[str, Any]] | None:
            stats = await node_stats(cluster)
            return stats if _count(stats[A], "park.continued_elsewhere") == 1 else None

        await wait_for(retired, "A to retire its parked copy on B's notice")
        stats = await node_stats(cluster)
        assert stats[A]["parked"] == 2  # kept[-1]'s and the socket's: second's is gone
        assert _count(stats[B], "create.store_hydrate") == 1
        assert _count(stats[B], "park.notice_sent") == 1
        assert _count(stats[B], "create.unparked") == 0
        again = await _create(a, second, _answer(second, "t2"))  # a branch of `second` on A
        assert response_shape(again) == response_shape(moved)
        stats = await node_stats(cluster)
        assert _count(stats[A], "create.unparked") == 3  # no stale rollout resumed
        assert _count(stats[A], "create.hydrated") + _count(stats[A], "create.store_hydrate") == 1
    finally:
        await a.close()
        await b.close()
        await redis.aclose()
