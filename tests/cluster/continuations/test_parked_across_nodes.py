"""Parked rollouts across nodes (PARK-8..PARK-10, PARK-20..PARK-22, CLUSTER-10, TURN-1): two
``rollout serve`` nodes on a real redis-server behind real HAProxy (and nginx), the openai SDK's
``responses.connect()`` as the client. One key's connections spread over both nodes. A rollout
suspended on a tool call is parked when its socket closes; the reconnect, through the balancer,
lands on either node and is served: on the parking node by the very same coroutine, elsewhere
by a ``store: true`` continuation from the store (the parked copy retired by the store's
notice) or, ``store: false`` included, by the parking node handing the rollout over."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable
from typing import Any

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from cli.launcher import Cluster, node_id
from tests.cluster.conftest import KEYS, OPERATOR_HEADERS, node_stats, node_url
from tests.support.tools import WEATHER

MODEL = "gpt-x"
KEY, OTHER_KEY = KEYS  # two tenants of the keyed clusters (an open cluster takes any key)


async def _terminal(conn: Any) -> Any:
    async for event in conn:
        if event.type in ("response.completed", "response.failed", "error"):
            return event
    raise AssertionError("the socket closed before a terminal event")


async def _suspend(url: str, store: bool, key: str = KEY) -> Any:
    """One connection: a create that ends on a tool call (the rollout suspends), then close."""
    sdk = AsyncOpenAI(base_url=url, api_key=key, max_retries=0)
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


async def _continue(url: str, first: Any, store: bool, key: str = KEY) -> Any:
    """A new connection continuing ``first`` with its tool's output: the terminal event."""
    call = first.output[-1]
    sdk = AsyncOpenAI(base_url=url, api_key=key, max_retries=0)
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


async def test_one_keys_connections_spread_over_both_nodes(cluster: Cluster) -> None:
    """CLUSTER-10: one API key's WebSocket connections, held open, go to the node with fewer
    open connections (HAProxy ``leastconn``, nginx ``least_conn``): four sockets, two a node;
    its HTTP requests reach both nodes too."""
    headers = {"Authorization": f"Bearer {KEY}"}
    before = await node_stats(cluster)
    async with aiohttp.ClientSession(headers=headers) as http:
        sockets = [await http.ws_connect(f"{cluster.url}/responses") for _ in range(4)]
        try:
            stats = await _until(cluster, lambda s: sum(_opened(s, before)) == 4)
            assert _opened(stats, before) == [2, 2], stats
        finally:
            for ws in sockets:
                await ws.close()
        for _ in range(6):
            body = {"model": MODEL, "input": "Say hi", "store": False}
            async with http.post(f"{cluster.url}/responses", json=body) as resp:
                assert resp.status == 200
    after = await node_stats(cluster)
    served = [_count(a, "create.stateless") - _count(b, "create.stateless")
              for a, b in zip(after, before, strict=True)]  # fmt: skip
    assert sum(served) == 6 and min(served) >= 1, served


async def test_new_sockets_go_to_the_node_with_fewer_open_ones(cluster: Cluster) -> None:
    """CLUSTER-10: least connections, not turns: six sockets spread three a node; the three on
    one node close; the next three all go to that node, which holds fewer open connections
    (round robin would alternate and send one of them to the busy node)."""
    headers = {"Authorization": f"Bearer {KEY}"}
    async with aiohttp.ClientSession(headers=headers) as http:
        held: list[tuple[int, aiohttp.ClientWebSocketResponse]] = []
        try:
            for _ in range(6):
                held.append(await _open_one(http, cluster))
            busy = held[0][0]
            for node, ws in held:
                if node != busy:
                    await ws.close()
            held = [(node, ws) for node, ws in held if node == busy]
            assert len(held) == 3, [node for node, _ in held]
            await _until(cluster, lambda s: s[1 - busy]["open_sessions"] == 0)
            for _ in range(3):
                held.append(await _open_one(http, cluster))
            assert [node for node, _ in held[3:]] == [1 - busy] * 3, [n for n, _ in held]
        finally:
            for _, ws in held:
                await ws.close()


async def _open_one(
    http: aiohttp.ClientSession, cluster: Cluster
) -> tuple[int, aiohttp.ClientWebSocketResponse]:
    """One WebSocket through the balancer, and the node it reached (whose accepted-socket
    count went up)."""
    before = await node_stats(cluster)
    ws = await http.ws_connect(f"{cluster.url}/responses")
    stats = await _until(cluster, lambda s: sum(_opened(s, before)) == 1)
    return _opened(stats, before).index(1), ws


def _opened(stats: list[dict[str, Any]], before: list[dict[str, Any]]) -> list[int]:
    return [_count(a, "ws.connections") - _count(b, "ws.connections")
            for a, b in zip(stats, before, strict=True)]  # fmt: skip


async def test_a_reconnect_through_the_balancer_resumes_the_parked_rollout(
    cluster: Cluster,
) -> None:
    """PARK-3, PARK-9, PARK-21: through the balancer (HAProxy and nginx), for ``store: true``
    and ``store: false``: the closed socket's rollout is parked on one node; the reconnect lands
    on either node and continues it: the same coroutine on its node (``create.unparked``), else
    from the store (``store: true``) or handed over (``store: false``). Either way it is parked
    nowhere afterwards: it never lives on in two places."""
    for store in (True, False):
        before = await node_stats(cluster)
        first = await _suspend(cluster.url, store)
        home = _parked_on(await _until(cluster, lambda s: sum(x["parked"] for x in s) == 1))
        resumed = await _continue(cluster.url, first, store)
        assert resumed.type == "response.completed", resumed
        assert resumed.response.output_text == "Based on the tool results: sunny"
        assert resumed.response.previous_response_id == first.id
        stats = await _until(cluster, lambda s: sum(x["parked"] for x in s) == 0)
        moved = {
            name: [_count(a, name) - _count(b, name) for a, b in zip(stats, before, strict=True)]
            for name in ("create.unparked", "create.store_hydrate", "create.handed_over")
        }
        other_path = "create.store_hydrate" if store else "create.handed_over"
        on_home = moved["create.unparked"][home] == 1
        elsewhere = moved[other_path][1 - home] == 1
        assert on_home != elsewhere, moved  # exactly one of the two served it
        assert sum(sum(v) for v in moved.values()) == 1, moved


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


async def test_node_changed_store_false_is_handed_over(keyed_cluster: Cluster) -> None:
    """PARK-21, PARK-22, OWN-2: a ``store: false`` rollout parked on one node is continued on
    the other (straight to it). Another key naming it there gets exactly
    ``previous_response_not_found`` and the rollout stays parked; its own key gets it served
    there: the parking node hands its items over and retires its copy (``park.handed_over``),
    the other node serves the turn (``create.handed_over``). Nothing of it went to the store,
    and a second continuation of the same response, anywhere, finds nothing."""
    cluster = keyed_cluster
    first = await _suspend(cluster.url, store=False)
    home = _parked_on(await _until(cluster, lambda s: sum(x["parked"] for x in s) == 1))
    other = 1 - home
    foreign = await _continue(node_url(cluster, other), first, store=False, key=OTHER_KEY)
    assert foreign.type == "error", foreign
    assert (foreign.error.code, foreign.error.param) == (
        "previous_response_not_found",
        "previous_response_id",
    )
    assert foreign.error.message == f"Previous response with id '{first.id}' not found."
    stats = await node_stats(cluster)
    assert stats[home]["parked"] == 1 and _count(stats[home], "park.handed_over") == 0
    moved = await _continue(node_url(cluster, other), first, store=False)
    assert moved.type == "response.completed", moved
    assert moved.response.output_text == "Based on the tool results: sunny"
    assert moved.response.previous_response_id == first.id
    stats = await _until(cluster, lambda s: s[home]["parked"] == 0)
    assert _count(stats[home], "park.handed_over") == 1
    assert _count(stats[other], "create.handed_over") == 1
    assert _count(stats[other], "park.notice_sent") == 0  # nothing was read from the store
    sdk = AsyncOpenAI(base_url=cluster.url, api_key=KEY, max_retries=0)
    try:
        with pytest.raises(openai.NotFoundError):
            await sdk.responses.retrieve(first.id)  # store: false was never written (STORE-1)
    finally:
        await sdk.close()
    again = await _continue(node_url(cluster, home), first, store=False)
    assert again.type == "error" and again.error.code == "previous_response_not_found", again


async def test_an_unreachable_parking_node_costs_only_the_handover(
    haproxy_cluster: Cluster,
) -> None:
    """PARK-21: the node that parks a ``store: false`` rollout stops answering (SIGSTOP: its
    socket still accepts, nothing answers). A continuation on the other node asks it, gives up
    at the hand-over's bound (5 s, ``HANDOVER_TIMEOUT_S``), counts ``park.handover_failed`` and
    answers ``previous_response_not_found``, as if nothing were parked; it serves on."""
    cluster = haproxy_cluster
    first = await _suspend(cluster.url, store=False)
    home = _parked_on(await _until(cluster, lambda s: sum(x["parked"] for x in s) == 1))
    other = 1 - home
    proc = cluster.nodes[home].proc
    assert proc is not None
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        lost = await _continue(node_url(cluster, other), first, store=False)
        async with (
            aiohttp.ClientSession() as http,
            http.get(
                f"http://127.0.0.1:{cluster.nodes[other].port}/debug/stats",
                headers=OPERATOR_HEADERS,
            ) as resp,
        ):
            stats = await resp.json()  # the stopped node would not answer its own
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    assert lost.type == "error", lost
    assert (lost.error.code, lost.error.param) == (
        "previous_response_not_found",
        "previous_response_id",
    )
    assert _count(stats, "park.handover_failed") == 1, stats["counters"]
    assert _count(stats, "park.handover_missed") == 0 and _count(stats, "create.handed_over") == 0
    served = await _suspend(node_url(cluster, other), store=False)
    assert served.status == "completed"


async def test_the_handover_route_is_for_nodes_only(keyed_cluster: Cluster) -> None:
    """PARK-22, CLUSTER-12: the hand-over route refuses a token its store did not make, also
    with a valid API key (403 ``forbidden`` from the node, nothing claimed), and the balancer
    refuses the route itself: its own 403 (not the node's JSON error body), and no node sees
    the request (only the direct one is counted ``park.handover_refused``)."""
    cluster = keyed_cluster
    first = await _suspend(cluster.url, store=False)
    home = _parked_on(await _until(cluster, lambda s: sum(x["parked"] for x in s) == 1))
    body = {"response_id": first.id, "owner": None}
    headers = {"Authorization": f"Bearer {KEY}", "x-rollout-node-token": "0" * 64}
    direct = f"http://127.0.0.1:{cluster.nodes[home].port}/cluster/v1/handover"
    through = cluster.url.removesuffix("/v1") + "/cluster/v1/handover"
    async with aiohttp.ClientSession() as http:
        async with http.post(direct, json=body, headers=headers) as resp:
            assert resp.status == 403
            assert (await resp.json())["error"]["code"] == "forbidden"  # the node's refusal
        for _ in range(2):  # leastconn would send a second one to the other node
            async with http.post(through, json=body, headers=headers) as resp:
                assert resp.status == 403, through
                refusal = await resp.text()
                # the balancer's page (HAProxy's or nginx's HTML), not the node's JSON error
                assert resp.content_type == "text/html", (resp.content_type, refusal)
                assert "403 Forbidden" in refusal and '"error"' not in refusal, refusal
    stats = await node_stats(cluster)
    assert stats[home]["parked"] == 1
    assert [_count(s, "park.handover_refused") for s in stats] == [
        int(i == home) for i in range(len(stats))
    ], stats  # the nodes saw only the direct request


async def test_a_drained_node_retires_what_it_parks(haproxy_cluster: Cluster) -> None:
    """PARK-10, DRAIN-3, PARK-20: the node that parks a ``store: true`` and a ``store: false``
    rollout is stopped (SIGTERM: it drains and retires them, and their addresses go). The
    reconnects through the balancer land on the other node: the ``store: true`` one continues
    from the store, the ``store: false`` one is exactly ``previous_response_not_found``."""
    cluster = haproxy_cluster
    home = 0  # both on one node (through the balancer they would spread, CLUSTER-10)
    stored = await _suspend(node_url(cluster, home), store=True)
    local = await _suspend(node_url(cluster, home), store=False)
    await _until(cluster, lambda s: s[home]["parked"] == 2)
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
