"""Background runs reached from any node (LIVE-1..LIVE-3, BG-4..BG-9): two ``rollout serve``
nodes on a real redis-server behind real HAProxy, the openai SDK as the client. A run started on
node 0 is followed, resumed, cancelled and deleted through the balancer from node 1 (the
turn-state token picks the node, TURN-1); a run whose node is killed -9 ends ``failed``, never
``in_progress`` forever."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

from cli.launcher import Cluster
from tests.cluster.conftest import KEYS, cluster_spec, node_counters, via

MODEL = "gpt-x"
KEY, OTHER_KEY = KEYS
LONG = " ".join(f"word{n}" for n in range(40))  # the simulator answers ~45 tokens


@pytest.fixture
async def slow_cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    """Keyed nodes whose simulator samples 10 tokens a second: a run lasts seconds."""
    running = Cluster(cluster_spec(tmp_path, "haproxy", "--tps", "10", keyed=True))
    await running.start()
    try:
        yield running
    finally:
        await running.stop()


def _sdk(cluster: Cluster, key: str = KEY) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=cluster.url, api_key=key, max_retries=0)


async def _start(sdk: AsyncOpenAI, node: int) -> Any:
    created = await sdk.responses.create(
        model=MODEL, input=LONG, background=True, extra_headers=via(node)
    )
    assert created.status == "queued"
    return created


async def _events(sdk: AsyncOpenAI, response_id: str, node: int, after: int, n: int) -> list[Any]:
    """Up to ``n`` events after ``after``, followed from node ``node``; then leave."""
    got: list[Any] = []
    stream = await sdk.responses.retrieve(
        response_id, stream=True, starting_after=after, extra_headers=via(node)
    )
    async for event in stream:
        got.append(event)
        if len(got) == n:
            break
    await stream.close()
    return got


async def test_follow_resume_and_cancel_from_the_other_node(slow_cluster: Cluster) -> None:
    """LIVE-2, BG-4, BG-5, BG-6: node 1 relays node 0's run: a follower reads from the first
    event, leaves, resumes after the last it saw and gets every later event exactly once;
    the cancel sent to node 1 cancels the run on node 0 and answers it ``cancelled``, and
    another key's cancel there is not found."""
    cluster = slow_cluster
    sdk, other = _sdk(cluster), _sdk(cluster, OTHER_KEY)
    try:
        created = await _start(sdk, 0)
        head = await _events(sdk, created.id, 1, -1, 4)
        assert [e.sequence_number for e in head] == [0, 1, 2, 3]
        rest = await _events(sdk, created.id, 1, 3, 3)
        assert [e.sequence_number for e in rest] == [4, 5, 6]
        with pytest.raises(openai.NotFoundError):
            await other.responses.cancel(created.id, extra_headers=via(1))
        cancelled = await sdk.responses.cancel(created.id, extra_headers=via(1))
        assert cancelled.status == "cancelled", cancelled
        polled = await sdk.responses.retrieve(created.id, extra_headers=via(1))
        assert polled.status == "cancelled"
        tail = await _events(sdk, created.id, 1, 6, 10_000)  # the log, kept on node 0
        assert [e.sequence_number for e in tail] == list(range(7, 7 + len(tail)))
    finally:
        await sdk.close()
        await other.close()
    counters = await node_counters(cluster)
    assert counters[0].get("runs.remote_cancelled") == 1
    assert counters[1].get("runs.cancel_forwarded") == 1
    assert counters[1].get("runs.follow_forwarded") == 3


async def test_delete_from_the_other_node_cancels_first(slow_cluster: Cluster) -> None:
    """LIVE-2, BG-9: a DELETE sent to node 1 cancels node 0's run before deleting the record,
    so no record reappears when the run ends there."""
    cluster = slow_cluster
    sdk = _sdk(cluster)
    try:
        created = await _start(sdk, 0)
        await _events(sdk, created.id, 0, -1, 2)  # it runs
        await sdk.responses.delete(created.id, extra_headers=via(1))
        counters = await node_counters(cluster)
        assert counters[0].get("runs.remote_cancelled") == 1
        with pytest.raises(openai.NotFoundError):
            await sdk.responses.retrieve(created.id, extra_headers=via(0))
    finally:
        await sdk.close()


async def test_a_run_whose_node_died_ends_failed(slow_cluster: Cluster) -> None:
    """LIVE-1, LIVE-3: node 0 is killed -9 mid-run. A cancel on node 1 finds nobody at the
    lease's address and answers the response settled ``failed``; a second run on the dead
    node, only polled, is ``failed`` once its lease lapses (nobody renews it). Neither stays
    ``in_progress``."""
    cluster = slow_cluster
    sdk = _sdk(cluster)
    try:
        cancelled_one = await _start(sdk, 0)
        polled_one = await _start(sdk, 0)
        await _events(sdk, polled_one.id, 0, -1, 2)  # both run
        proc = cluster.nodes[0].proc
        assert proc is not None
        proc.kill()
        await proc.wait()
        answered = await sdk.responses.cancel(cancelled_one.id, extra_headers=via(1))
        assert answered.status == "failed", answered
        assert answered.error is not None and answered.error.code == "server_error"
        for _ in range(400):  # the lease (15 s) lapses; never a wall-clock assertion
            polled = await sdk.responses.retrieve(polled_one.id, extra_headers=via(1))
            if polled.status not in ("queued", "in_progress"):
                break
            await asyncio.sleep(0.1)
        assert polled.status == "failed", polled
    finally:
        await sdk.close()


async def test_a_streamed_repeat_on_the_other_node_follows_the_first_live(
    slow_cluster: Cluster,
) -> None:
    """LIVE-8, IDEM-4: a streamed create with an Idempotency-Key runs on node 0; its repeat
    reaches node 1 while it runs and follows it there, live, event for event (node 1 asks node
    0, whose address the key's entry names); the model ran once, on node 0."""
    cluster = slow_cluster
    sdk = _sdk(cluster)
    key = {"Idempotency-Key": "soak-repeat-1"}
    try:
        first = await sdk.responses.create(
            model=MODEL, input=LONG, stream=True, extra_headers={**key, **via(0)}
        )
        seen = []
        async for event in first:
            seen.append(event.model_dump())
            if len(seen) == 4:
                break
        repeat = await sdk.responses.create(
            model=MODEL, input=LONG, stream=True, extra_headers={**key, **via(1)}
        )
        followed = [event.model_dump() async for event in repeat]
        seen += [event.model_dump() async for event in first]
    finally:
        await sdk.close()
    assert followed == seen
    assert seen[-1]["type"] == "response.completed"
    counters = await node_counters(cluster)
    assert [c.get("create.stateless", 0) for c in counters] == [1, 0]
