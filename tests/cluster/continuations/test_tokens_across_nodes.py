"""A ``tokens`` rollout moves between nodes token-exact (LIVE-4, LIVE-5, PARK-21): two
``rollout serve`` nodes routed to one independent token peer (the test's vLLM-shaped server with
its own tokenizer, ``tests/upstream/token_peer.py``), a real redis-server, real HAProxy in
front. A rollout suspended on a tool call is parked on node 0; its continuation goes through the
balancer to node 1 (the turn-state token picks the node, TURN-1) and is handed over with its
token trajectory, so the peer sees the next prompt extend the previous prompt and its sampled
ids exactly, over WebSocket and HTTP, ``store: false`` and ``store: true``. A continuation that
reaches node 1 before node 0 saw the old socket close waits for the rollout and is handed it.
The same holds for a harmony route (``template = "harmony"``, gpt-oss's o200k ids, HARMONY-1):
its analysis message and tool call travel in the hand-over and are not re-rendered."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI

from cli.launcher import Cluster
from tests.cluster.conftest import ROUTED_MODEL as MODEL
from tests.cluster.conftest import node_stats, routed_cluster, tokens_route, via
from tests.support.fixtures import started
from tests.support.tools import WEATHER
from tests.upstream.reasoning_peer import HARMONY_SCRIPT, HarmonyPeer
from tests.upstream.token_peer import TokenPeer, assert_exact, make_tokenizer


@pytest.fixture
async def tokens_cluster(tmp_path: Path, peer: TokenPeer) -> AsyncIterator[Cluster]:
    """Two nodes whose one model is a ``tokens`` route to ``peer``, behind HAProxy."""
    async with routed_cluster(tmp_path, tokens_route(tmp_path, peer)) as running:
        yield running


@pytest.fixture
async def harmony_peer(tmp_path: Path) -> AsyncIterator[HarmonyPeer]:
    async with started(HarmonyPeer(make_tokenizer(tmp_path / "tok"))) as running:
        yield running


@pytest.fixture
async def harmony_cluster(tmp_path: Path, harmony_peer: HarmonyPeer) -> AsyncIterator[Cluster]:
    """Two nodes whose one model is a harmony ``tokens`` route to ``harmony_peer``."""
    route = {"backend": "tokens", "api": "vllm", "base_url": harmony_peer.base_url,
             "model": "gpt-oss-tiny", "template": "harmony"}  # fmt: skip
    async with routed_cluster(tmp_path, route) as running:
        yield running


def _output(call: Any) -> list[dict[str, str]]:
    return [{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}]


async def _ws_turn(sdk: AsyncOpenAI, node: int, **create: Any) -> Any:
    async with sdk.responses.connect(extra_headers=via(node)) as conn:
        await conn.response.create(model=MODEL, tools=[WEATHER], **create)
        async for event in conn:
            if event.type in ("response.completed", "response.failed", "error"):
                return event
    raise AssertionError("the socket closed before a terminal event")


async def _count(cluster: Cluster, node: int, name: str) -> int:
    return int((await node_stats(cluster))[node]["counters"].get(name, 0))


async def _parked(cluster: Cluster, node: int) -> None:
    for _ in range(400):
        if (await node_stats(cluster))[node]["parked"] == 1:
            return
        await asyncio.sleep(0.025)
    raise AssertionError("never parked")


@pytest.mark.parametrize("store", [False, True])
async def test_ws_continuation_on_another_node_is_token_exact(
    tokens_cluster: Cluster, peer: TokenPeer, store: bool
) -> None:
    """LIVE-4: WS, parked on node 0, continued through the balancer on node 1: the prompt node
    1 sends extends node 0's prompt plus its sampled ids exactly, ``store: false`` included
    (handed over) and ``store: true`` (its stored trajectory, TOK-8)."""
    cluster = tokens_cluster
    sdk = AsyncOpenAI(base_url=cluster.url, api_key="x", max_retries=0)
    try:
        first = await _ws_turn(sdk, 0, input="Weather in Paris?", store=store)
        assert first.type == "response.completed", first
        call = first.response.output[-1]
        assert call.type == "function_call"
        await _parked(cluster, 0)
        second = await _ws_turn(
            sdk, 1, previous_response_id=first.response.id, input=_output(call), store=store
        )
    finally:
        await sdk.close()
    assert second.type == "response.completed", second
    assert second.response.output_text.startswith("Tool said"), second.response
    assert len(peer.turns) == 2
    assert_exact(peer)  # turn 2's prompt = turn 1's prompt + its sampled ids + new items
    moved = "create.store_hydrate" if store else "create.handed_over"
    assert await _count(cluster, 1, moved) == 1


async def test_http_continuation_on_another_node_is_token_exact(
    tokens_cluster: Cluster, peer: TokenPeer
) -> None:
    """LIVE-4 over HTTP: a ``store: false`` rollout suspended on node 0's WebSocket, continued
    by an HTTP create through the balancer on node 1, then again on node 0 over WS: every
    prompt extends the one before it exactly."""
    cluster = tokens_cluster
    sdk = AsyncOpenAI(base_url=cluster.url, api_key="x", max_retries=0)
    try:
        first = await _ws_turn(sdk, 0, input="Weather in Paris?", store=False)
        call = first.response.output[-1]
        await _parked(cluster, 0)
        second = await sdk.responses.create(
            model=MODEL, tools=[WEATHER], store=False, previous_response_id=first.response.id,
            input=_output(call), extra_headers=via(1),
        )  # fmt: skip
    finally:
        await sdk.close()
    assert second.status == "completed", second
    assert len(peer.turns) == 2
    assert_exact(peer)
    assert await _count(cluster, 1, "create.handed_over") == 1


async def test_a_reconnect_before_the_old_close_waits_and_is_handed_over(
    tokens_cluster: Cluster, peer: TokenPeer
) -> None:
    """LIVE-5: the continuation reaches node 1 while node 0 still holds the old socket open
    (the rollout suspended, not parked yet). Node 1 waits, node 0 parks it when the old socket
    closes a moment later, and node 1 is handed it: never ``previous_response_not_found``."""
    cluster = tokens_cluster
    sdk = AsyncOpenAI(base_url=cluster.url, api_key="x", max_retries=0)
    try:
        async with sdk.responses.connect(extra_headers=via(0)) as old:
            await old.response.create(
                model=MODEL, tools=[WEATHER], input="Weather in Paris?", store=False
            )
            async for event in old:
                if event.type == "response.completed":
                    first = event.response
                    break
            call = first.output[-1]
            moved = asyncio.create_task(
                _ws_turn(sdk, 1, previous_response_id=first.id, input=_output(call), store=False)
            )
            await asyncio.sleep(0.3)  # the continuation is on its way: the old socket closes
            assert not moved.done()
        second = await moved
    finally:
        await sdk.close()
    assert second.type == "response.completed", second
    assert_exact(peer)
    stats = await node_stats(cluster)
    assert stats[1]["counters"].get("park.handover_waited", 0) == 1
    assert stats[1]["counters"].get("create.handed_over", 0) == 1


@pytest.mark.parametrize("http", [False, True])
async def test_a_harmony_continuation_on_another_node_is_token_exact(
    harmony_cluster: Cluster, harmony_peer: HarmonyPeer, http: bool
) -> None:
    """LIVE-4 on a harmony route (HARMONY-1): a ``store: false`` rollout whose first turn
    sampled an analysis message and a ``functions.get_weather`` call is parked on node 0 and
    continued through the balancer on node 1, over WS or HTTP. Node 1's prompt is node 0's
    prompt plus the sampled o200k ids plus the tool's message, exactly: the analysis message
    harmony drops when it renders a history is still there."""
    cluster, peer = harmony_cluster, harmony_peer
    peer.script.extend(HARMONY_SCRIPT[:2])
    sdk = AsyncOpenAI(base_url=cluster.url, api_key="x", max_retries=0)
    try:
        first = await _ws_turn(sdk, 0, input="Weather?", store=False)
        assert first.type == "response.completed", first
        call = first.response.output[-1]
        assert [item.type for item in first.response.output] == ["reasoning", "function_call"]
        await _parked(cluster, 0)
        follow = {"previous_response_id": first.response.id, "input": _output(call)}
        if http:
            second = await sdk.responses.create(
                model=MODEL, tools=[WEATHER], store=False, extra_headers=via(1), **follow
            )
        else:
            second = (await _ws_turn(sdk, 1, store=False, **follow)).response
    finally:
        await sdk.close()
    assert second.status == "completed", second
    assert second.output_text == "It is sunny in Paris."
    assert len(peer.turns) == 2
    assert_exact(peer)
    assert peer.text(peer.turns[1].prompt).endswith(
        "<|call|><|start|>functions.get_weather to=assistant<|channel|>commentary"
        "<|message|>sunny<|end|><|start|>assistant"
    )
    assert await _count(cluster, 1, "create.handed_over") == 1
