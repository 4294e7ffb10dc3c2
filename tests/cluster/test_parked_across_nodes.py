"""Parked rollouts across nodes (PARK-8..PARK-10, TURN-1): two ``rollout serve`` nodes on a real
redis-server behind real HAProxy (and nginx), the openai SDK's ``responses.connect()`` as the
client. A rollout suspended on a tool call is parked when its socket closes; the reconnect,
through the balancer, lands on the node that parks it and resumes the very same coroutine. When
the node changed, a ``store: true`` continuation is served from the store and the parked copy is
retired by the store's notice; a ``store: false`` one is exactly ``previous_response_not_found``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
from openai import AsyncOpenAI

from cli.cluster import Cluster, node_id
from tests.cluster.conftest import node_stats, node_url
from tests.support.tools import WEATHER

MODEL = "gpt-x"
KEY = "key-a"  # the balancer hashes the Authorization header: one key, one home node


async def _terminal(conn: Any) -> Any:
    async for event in conn:
        if event.type in ("response.completed", "response.failed", "error"):
            return event
    raise AssertionError("the socket closed before a terminal event")


async def _suspend(url: str, store: bool) -> Any:
    """One connection: a create that ends on a tool call (the rollout suspends), then close."""
    sdk = AsyncOpenAI(base_url=url, api_key=KEY, max_retries=0)
    try:
        async with sdk.responses.connect() as conn:
            await conn.response.create(
                model=MODEL, input="Weather in Paris?", tools=[WEATHER], store=store
            )
            done = await _terminal(conn)
    finally:
        await sdk.close()
    assert done.type == "response.completed", done
    assert done.response.output[-1].type == "function_call"
    return done.response


async def _continue(url: str, first: Any, store: bool) -> Any:
    """A new connection continuing ``first`` with its tool's output: the terminal event."""
    call = first.output[-1]
    sdk = AsyncOpenAI(base_url=url, api_key=KEY, max_retries=0)
    try:
        async with sdk.responses.connect() as conn:
            await conn.response.create(
                model=MODEL, previous_response_id=first.id, tools=[WEATHER], store=store,
                input=[{"type": "function_call_output", "call_id": call.call_id,
                        "output": "sunny"}],
            )  # fmt: skip
            return await _terminal(conn)
    finally:
        await sdk.close()


async def _until(cluster: Cluster, holds: Callable[[list[dict[str, Any]]], bool]) -> list[Any]:
    """A close or a notice lands on the server a moment after the client acted: poll the nodes'
    stats until ``holds`` (bounded; never a wall-clock assertion)."""
    for _ in range(400):
        stats = await node_stats(cluster)
        if holds(stats):
            return stats
        await asyncio.sleep(0.025)
    raise AssertionError(f"never held: {stats}")


def _count(stats: dict[str, Any], name: str) -> int:
    return int(stats.get("counters", {}).get(name, 0))


def _parked_on(stats: list[dict[str, Any]]) -> int:
    (home,) = [i for i, s in enumerate(stats) if s.get("parked")]
    return home


async def test_the_reconnect_resumes_the_parked_coroutine_on_its_node(cluster: Cluster) -> None:
    """PARK-8, PARK-3: through the balancer (HAProxy and nginx), for ``store: true`` and
    ``store: false``: the closed socket's rollout is parked on one node, the reconnect lands on
    that node and resumes the same coroutine there (``create.unparked``), nowhere else."""
    for round_, store in enumerate((True, False), start=1):
        first = await _suspend(cluster.url, store)
        home = _parked_on(await _until(cluster, lambda s: sum(x["parked"] for x in s) == 1))
        resumed = await _continue(cluster.url, first, store)
        assert resumed.type == "response.completed", resumed
        assert resumed.response.output_text == "Based on the tool results: sunny"
        assert resumed.response.previous_response_id == first.id
        stats = await _until(cluster, lambda s: sum(x["parked"] for x in s) == 0)
        assert [_count(s, "create.unparked") for s in stats] == [
            round_ if i == home else 0 for i in range(len(stats))
        ], stats
        assert sum(_count(s, "create.store_hydrate") for s in stats) == 0  # the coroutine, no store


async def test_node_changed_store_true_continues_from_the_store(haproxy_cluster: Cluster) -> None:
    """PARK-9, CLUSTER-2: the reconnect of a ``store: true`` rollout lands on the other node
    (here: straight to it). It is served from the store, and the node that parked the rollout
    retires its copy on the store's notice at once (``park.continued_elsewhere``), so the
    rollout never lives on in two places: a later reconnect to the first node cannot resume it
    a second time, it takes the store path like any stored response."""
    cluster = haproxy_cluster
    first = await _suspend(cluster.url, store=True)
    home = _parked_on(await _until(cluster, lambda s: sum(x["parked"] for x in s) == 1))
    other = 1 - home
    moved = await _continue(node_url(cluster, other), first, store=True)
    assert moved.type == "response.completed", moved
    assert moved.response.output_text == "Based on the tool results: sunny"
    stats = await _until(cluster, lambda s: _count(s[home], "park.continued_elsewhere") == 1)
    assert stats[home]["parked"] == 0
    assert _count(stats[other], "create.store_hydrate") == 1
    assert _count(stats[other], "park.notice_sent") == 1
    assert sum(_count(s, "create.unparked") for s in stats) == 0
    again = await _continue(node_url(cluster, home), first, store=True)  # a branch of `first`
    assert again.type == "response.completed", again
    stats = await node_stats(cluster)
    assert _count(stats[home], "create.unparked") == 0  # the parked coroutine is gone
    assert _count(stats[home], "create.hydrated") + _count(stats[home], "create.store_hydrate") == 1


async def test_node_changed_store_false_is_exactly_not_found(haproxy_cluster: Cluster) -> None:
    """PARK-5, PARK-9, STORE-1: a ``store: false`` rollout's state never leaves its process:
    the other node answers exactly ``previous_response_not_found`` and sends no notice; the
    rollout stays parked on its node, and a reconnect through the balancer still resumes it."""
    cluster = haproxy_cluster
    first = await _suspend(cluster.url, store=False)
    home = _parked_on(await _until(cluster, lambda s: sum(x["parked"] for x in s) == 1))
    other = 1 - home
    refused = await _continue(node_url(cluster, other), first, store=False)
    assert refused.type == "error", refused
    assert (refused.error.code, refused.error.param) == (
        "previous_response_not_found",
        "previous_response_id",
    )
    assert refused.error.message == f"Previous response with id '{first.id}' not found."
    stats = await node_stats(cluster)
    assert stats[home]["parked"] == 1 and _count(stats[other], "park.notice_sent") == 0
    resumed = await _continue(cluster.url, first, store=False)
    assert resumed.type == "response.completed", resumed
    stats = await node_stats(cluster)
    assert _count(stats[home], "create.unparked") == 1


async def test_a_drained_node_retires_what_it_parks(haproxy_cluster: Cluster) -> None:
    """PARK-10, DRAIN-3: the node that parks a ``store: true`` and a ``store: false`` rollout is
    stopped (SIGTERM: it drains and retires them). The reconnects through the balancer land on
    the other node: the ``store: true`` one continues from the store, the ``store: false`` one
    is exactly ``previous_response_not_found``."""
    cluster = haproxy_cluster
    stored = await _suspend(cluster.url, store=True)
    local = await _suspend(cluster.url, store=False)
    home = _parked_on(await _until(cluster, lambda s: sum(x["parked"] for x in s) == 2))
    assert (await cluster.nodes[home].stop()) == 0
    moved = await _continue(cluster.url, stored, store=True)
    assert moved.type == "response.completed", moved
    assert moved.response.output_text == "Based on the tool results: sunny"
    refused = await _continue(cluster.url, local, store=False)
    assert refused.type == "error", refused
    assert refused.error.code == "previous_response_not_found"
    log = cluster.nodes[home].log.read_text()
    assert "retired 2 parked rollouts: draining" in log, log


async def test_a_turn_state_token_routes_to_its_node(cluster: Cluster) -> None:
    """TURN-1, PARK-8: a request carrying ``x-codex-turn-state`` naming node B reaches node B,
    for each node, over HTTP and for a WebSocket upgrade, whatever its API key hashes to; a
    token naming a node that is down is served by another node."""
    async with aiohttp.ClientSession() as http:
        for index in range(len(cluster.nodes)):
            token = f"rts1.{node_id(index)}.{'0' * 32}"
            headers = {"x-codex-turn-state": token, "Authorization": f"Bearer {KEY}"}
            before = await node_stats(cluster)
            async with http.post(
                f"{cluster.url}/responses", headers=headers,
                json={"model": MODEL, "input": "Say hi", "store": False},
            ) as resp:  # fmt: skip
                assert resp.status == 200
                assert resp.headers["x-codex-turn-state"] == token  # echoed (TURN-2)
            async with http.ws_connect(f"{cluster.url}/responses", headers=headers) as ws:
                await ws.close()
            after = await node_stats(cluster)
            echoed = [_count(a, "turn_state.echoed") - _count(b, "turn_state.echoed")
                      for a, b in zip(after, before, strict=True)]  # fmt: skip
            assert echoed == [2 if i == index else 0 for i in range(len(after))], echoed
        await cluster.nodes[0].stop()
        await cluster.wait_routed()
        headers = {"x-codex-turn-state": f"rts1.{node_id(0)}.{'0' * 32}"}
        async with http.post(
            f"{cluster.url}/responses", headers=headers, json={"model": MODEL, "input": "hi"}
        ) as resp:
            assert resp.status == 200
        assert _count((await node_stats(cluster))[1], "turn_state.foreign") == 1
