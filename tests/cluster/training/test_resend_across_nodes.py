"""A resend continues on any node of a cluster (COMPAT-10): two ``rollout serve`` nodes that
require API keys, sharing a real redis-server, each routing its one model as a ``tokens`` route
to one token peer (``tests/upstream/token_peer.py``, which samples ids a re-render never
produces). A ``store: true`` create answered by node 0, then the client's whole history sent
back to node 1 with no ``previous_response_id`` and no ids: the peer sees node 1's prompt be
node 0's prompt, its sampled ids and the new item's ids, exactly as a ``previous_response_id``
continuation of that response on node 1 sends; node 1 counts the store path. Another key's
identical history, and the history of a response deleted since, start afresh."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from cli.launcher import Cluster
from tests.cluster.conftest import KEYS, node_counters, node_url, routed_cluster, tokens_route
from tests.cluster.conftest import ROUTED_MODEL as MODEL
from tests.support.tools import WEATHER
from tests.upstream.token_peer import TokenPeer, assert_exact

KEY_A, KEY_B = KEYS


@pytest.fixture
async def cluster(tmp_path: Path, peer: TokenPeer) -> AsyncIterator[Cluster]:
    """Two keyed nodes whose one model is a ``tokens`` route to ``peer``, on one redis-server."""
    async with routed_cluster(tmp_path, tokens_route(tmp_path, peer), keyed=True) as running:
        yield running


async def _call(
    cluster: Cluster, node: int, key: str, method: str, path: str, body: Any = None
) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {key}"}
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, node_url(cluster, node) + path, json=body, headers=headers) as resp,
    ):
        answer: dict[str, Any] = await resp.json()
        assert resp.status == 200, answer
    return answer


async def _create(cluster: Cluster, node: int, key: str, **body: Any) -> dict[str, Any]:
    body = {"model": MODEL, "tools": [WEATHER], "store": True, **body}
    return await _call(cluster, node, key, "POST", "/responses", body)


async def _first_turn(cluster: Cluster, key: str, city: str) -> tuple[dict[str, Any], list[Any]]:
    """A create on node 0; the history a client keeping its own sends next: its input, the
    output as received (ids and status included), the tool's answer."""
    history: list[dict[str, Any]] = [{"role": "user", "content": f"Weather in {city}?"}]
    first = await _create(cluster, 0, key, input=history)
    call = first["output"][-1]
    assert call["type"] == "function_call", first
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}
    return first, [*history, *first["output"], output]


async def _index(cluster: Cluster) -> dict[str, int]:
    """The resend index's entries in the cluster's redis-server, with their TTLs (ms)."""
    client = aioredis.Redis.from_url(cluster.spec.store)
    try:
        keys = [key.decode() async for key in client.scan_iter(match="*resend:*")]
        return {key: int(await client.pttl(key)) for key in keys}
    finally:
        await client.aclose()


async def test_a_resend_on_another_node_continues_the_stored_response(
    cluster: Cluster, peer: TokenPeer
) -> None:
    """COMPAT-10: node 1 continues node 0's stored response from the whole history: its
    prompt is node 0's prompt, the sampled ids and the tool output's ids, and the same ids a
    ``previous_response_id`` continuation of it on node 1 sends; counted on node 1's store path."""
    first, history = await _first_turn(cluster, KEY_A, "Paris")
    second = await _create(cluster, 1, KEY_A, input=history)
    assert second["status"] == "completed", second
    assert second["output"][-1]["content"][0]["text"].startswith("Tool said"), second
    assert second["previous_response_id"] is None
    chained = await _create(cluster, 1, KEY_A, previous_response_id=first["id"], input=history[-1:])
    assert chained["status"] == "completed", chained
    assert len(peer.turns) == 3
    one, two, three = peer.turns
    assert two.prompt[: len(one.prompt) + len(one.answer)] == one.prompt + one.answer
    assert peer.text(two.prompt[len(one.prompt) + len(one.answer) :]).endswith(
        "<tool_response>\nsunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert three.prompt == two.prompt  # resend = previous_response_id, token for token
    counters = await node_counters(cluster)
    assert counters[1].get("resend.shared_hit") == 1
    assert counters[1].get("create.resent") == 1
    assert counters[1].get("create.store_hydrate") == 2  # the resend, then the chained create
    assert counters[0].get("create.resent", 0) == 0
    # One entry per distinct list, none naming a key: the resent and the chained response hold
    # the same list, so one entry stands for both.
    index = await _index(cluster)
    assert len(index) == 2, index
    assert all(KEY_A not in key and ttl > 0 for key, ttl in index.items()), index


async def test_another_keys_resend_or_a_deleted_ones_starts_afresh(
    cluster: Cluster, peer: TokenPeer
) -> None:
    """COMPAT-10: key B's history identical to key A's stored response is not looked up under
    A (B's own key finds nothing), and the history of a response deleted since is not found
    (OWN-2, STORE-11): the peer sees each rendered afresh, never a continued prefix."""
    _, history = await _first_turn(cluster, KEY_A, "Paris")
    other = await _create(cluster, 1, KEY_B, input=history)
    assert other["status"] == "completed", other
    deleted, gone = await _first_turn(cluster, KEY_A, "Rome")
    await _call(cluster, 0, KEY_A, "DELETE", f"/responses/{deleted['id']}")
    after = await _create(cluster, 1, KEY_A, input=gone)
    assert after["status"] == "completed", after
    assert len(peer.turns) == 4
    assert_exact(peer, firsts=4)  # no prompt extends an earlier one
    counters = await node_counters(cluster)
    assert counters[1].get("create.resent", 0) == 0
    assert counters[1].get("resend.shared_miss") == 1  # B: no entry under B's owner digest
    assert counters[1].get("resend.shared_stale") == 1  # A's deleted one: not found
