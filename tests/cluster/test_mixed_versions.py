"""A rolling upgrade without a failed request (LIVE-10): a cluster of the previous release's nodes
(the source tree of ``PREVIOUS_RELEASE``, run with this checkout's .venv) is upgraded one node at
a time to this tree's, behind HAProxy, on one redis-server. While one node is old and one new,
parked rollouts (suspended at a tool call over a WebSocket, continued from a fresh connection
that lands on the other node), background runs (followed and cancelled from the other node) and
an idempotent repeat (followed live from the other node) go across in both directions: the new
node reads the old node's answers, and answers the old node in the old format. Every request
the clients make succeeds (the SDK retries nothing: ``max_retries=0``)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI

from cli.launcher import Cluster
from engine.retained.handover import HANDOVER_PATH, NODE_PROTOCOL, VERSION_HEADER
from tests.cluster.conftest import KEYS, cluster_spec, node_counters, node_stats, via
from tests.support.tools import WEATHER
from tests.support.wait import wait_for

# The last commit of the previous release, whose nodes speak node protocol version 1 (the
# release before versions). Move it forward each release: to the last commit of the release
# before this one, whose NODE_PROTOCOL is this one's minus one (N accepts N-1).
PREVIOUS_RELEASE = "59cd6b8fe654721520a36e0784732637996beea2"
# The repository holding it: this checkout, or ROLLOUT_SOURCE_REPO (tools/mutants.py runs the
# tests in a copy without .git).
REPO = Path(os.environ.get("ROLLOUT_SOURCE_REPO") or Path(__file__).resolve().parents[2])
RUNS = ("cli", "engine", "protocol", "clients", "deploy")  # what a node of that tree imports

MODEL = "gpt-x"
KEY = KEYS[0]
RUN = "bench-text/400"  # ten seconds at 40 tokens a second: cancelled long before it ends
REPEATED = "bench-text/80"  # two seconds: its repeat arrives while it streams


def previous_release(into: Path) -> Path:
    """``PREVIOUS_RELEASE``'s source tree, extracted into ``into``. A clone without that commit
    (a shallow one) fails the test: the upgrade must be checked, never skipped."""
    found = subprocess.run(
        ["git", "-C", str(REPO), "cat-file", "-e", f"{PREVIOUS_RELEASE}^{{commit}}"],
        capture_output=True, check=False,
    )  # fmt: skip
    if found.returncode != 0:
        pytest.fail(
            f"commit {PREVIOUS_RELEASE} (the previous release, LIVE-10) is not in the git "
            f"repository at {REPO}: a shallow clone? `git fetch --unshallow` (CI clones with "
            "full history), or set ROLLOUT_SOURCE_REPO to a clone that has it"
        )
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", PREVIOUS_RELEASE, *RUNS],
        capture_output=True, check=True,
    )  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def _sdk(cluster: Cluster) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=cluster.url, api_key=KEY, max_retries=0)


async def _terminal(conn: Any) -> Any:
    async for event in conn:
        if event.type in ("response.completed", "response.failed", "error"):
            return event
    raise AssertionError("the socket closed before a terminal event")


async def _suspend(cluster: Cluster, node: int) -> Any:
    """A ``store: false`` create over a WebSocket through the balancer to ``node`` that ends on
    a tool call; the socket closes and the rollout is parked there (PARK-1)."""
    async with _sdk(cluster) as sdk, sdk.responses.connect(extra_headers=via(node)) as conn:
        await conn.response.create(
            model=MODEL, input="Weather in Paris?", tools=[WEATHER], store=False
        )
        done = await _terminal(conn)
    assert done.type == "response.completed", done
    assert done.response.output[-1].type == "function_call"

    async def parked_there() -> bool:
        return bool((await node_stats(cluster))[node]["parked"])

    await wait_for(parked_there, f"the rollout parked on node {node}")
    return done.response


async def _continue(cluster: Cluster, node: int, first: Any) -> Any:
    """A fresh WebSocket through the balancer to ``node``, continuing ``first`` with its tool's
    output: the terminal event."""
    call = first.output[-1]
    async with _sdk(cluster) as sdk, sdk.responses.connect(extra_headers=via(node)) as conn:
        await conn.response.create(
            model=MODEL, previous_response_id=first.id, tools=[WEATHER], store=False,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        )  # fmt: skip
        return await _terminal(conn)


async def _follow_and_cancel(cluster: Cluster, home: int, other: int) -> None:
    """A background run on ``home``, followed from ``other`` (its first two events, relayed)
    and cancelled from ``other`` (LIVE-2)."""
    async with _sdk(cluster) as sdk:
        created = await sdk.responses.create(
            model=RUN, input="go", background=True, extra_headers=via(home)
        )
        stream = await sdk.responses.retrieve(
            created.id, stream=True, starting_after=-1, extra_headers=via(other)
        )
        seen = []
        async for event in stream:
            seen.append(event.sequence_number)
            if len(seen) == 2:
                break
        await stream.close()
        assert seen == [0, 1]
        cancelled = await sdk.responses.cancel(created.id, extra_headers=via(other))
        assert cancelled.status == "cancelled", cancelled


async def _repeat(cluster: Cluster, home: int, other: int, key: str) -> None:
    """A streamed create with an Idempotency-Key on ``home``; its repeat on ``other`` follows
    it live, node to node (LIVE-8): the same events."""
    headers = {"Idempotency-Key": key}
    async with _sdk(cluster) as sdk:
        first = await sdk.responses.create(
            model=REPEATED, input="go", stream=True, extra_headers={**headers, **via(home)}
        )
        seen = []
        async for event in first:
            seen.append(event.model_dump())
            if len(seen) == 3:
                break
        repeat = await sdk.responses.create(
            model=REPEATED, input="go", stream=True, extra_headers={**headers, **via(other)}
        )
        followed = [event.model_dump() async for event in repeat]
        seen += [event.model_dump() async for event in first]
    assert followed == seen
    assert seen[-1]["type"] == "response.completed"


async def _speaks(cluster: Cluster, index: int) -> str | None:
    """The node protocol version node ``index`` says it answers in when asked in this one's
    (None: it says none, the release before versions)."""
    url = f"http://127.0.0.1:{cluster.nodes[index].port}{HANDOVER_PATH}"
    asked = {VERSION_HEADER: str(NODE_PROTOCOL)}
    async with aiohttp.ClientSession() as http, http.post(url, json={}, headers=asked) as r:
        assert r.status == 400  # not a hand-over request: nothing done
        return r.headers.get(VERSION_HEADER)


def _one_on(node: int | None) -> list[int]:
    return [1 if i == node else 0 for i in range(2)]


def _moved(after: list[dict[str, Any]], before: list[dict[str, Any]], name: str) -> list[int]:
    return [a.get(name, 0) - b.get(name, 0) for a, b in zip(after, before, strict=True)]


async def _across(cluster: Cluster, home: int, other: int, key: str) -> None:
    """Live state of ``home`` reached from ``other``: a parked rollout handed over (PARK-21),
    a background run followed and cancelled (LIVE-2), a repeat followed (LIVE-8); each
    counted on the node that did it, so each request landed where it was sent."""
    before = await node_counters(cluster)
    first = await _suspend(cluster, home)
    moved = await _continue(cluster, other, first)
    assert moved.type == "response.completed", moved
    assert moved.response.output_text == "Based on the tool results: sunny"
    assert moved.response.previous_response_id == first.id
    await _follow_and_cancel(cluster, home, other)
    await _repeat(cluster, home, other, key)
    expected = {
        "park.handed_over": home, "create.handed_over": other,
        "runs.remote_followed": home,  # asked node to node: only a peer's follow counts it
        "runs.remote_cancelled": home, "runs.cancel_forwarded": other,
        "park.handover_failed": None,
    }  # fmt: skip
    want = {name: _one_on(node) for name, node in expected.items()}
    # the model ran where each was sent, once: the parked create, the run, the repeated one
    want["create.stateless"] = [3 * n for n in _one_on(home)]
    seen: dict[str, list[int]] = {}

    async def counted() -> bool:  # a notice or a relay's end lands a moment later
        after = await node_counters(cluster)
        seen.update({name: _moved(after, before, name) for name in want})
        return seen == want

    try:
        await wait_for(counted, f"node {home}'s live state reached from node {other}")
    except AssertionError:
        assert seen == want, (home, other)


async def _upgrade(cluster: Cluster, index: int) -> None:
    """Node ``index`` drains, exits and starts again on this tree (DRAIN-5's step), and the
    balancer routes to it again: a request sent to it lands there."""
    node = cluster.nodes[index]
    await node.stop()
    node.tree = None
    await node.start()

    async def routed() -> bool:
        before = await node_counters(cluster)
        async with _sdk(cluster) as sdk:
            await sdk.responses.create(
                model="bench-text/1", input="hi", store=False, extra_headers=via(index)
            )
        return _moved(await node_counters(cluster), before, "create.stateless")[index] == 1

    await wait_for(routed, f"the balancer routing to node {index} again", limit=30)


@pytest.mark.timeout(180)
async def test_a_rolling_upgrade_hands_live_state_over_both_ways(tmp_path: Path) -> None:
    """LIVE-10, PARK-21, LIVE-2, LIVE-8, DRAIN-5: two nodes of the previous release; node 0 is
    upgraded: old -> new and new -> old hand-overs, follows, cancels and repeats all succeed;
    node 1 is upgraded: new -> new too. No client request fails."""
    old = previous_release(tmp_path / "previous")
    spec = cluster_spec(tmp_path, "haproxy", "--bench-models", "--tps", "40", keyed=True)
    spec.trees = {0: old, 1: old}
    cluster = Cluster(spec)
    await cluster.start()
    try:
        assert [await _speaks(cluster, i) for i in (0, 1)] == [None, None]  # two releases
        await _upgrade(cluster, 0)
        assert [await _speaks(cluster, i) for i in (0, 1)] == [str(NODE_PROTOCOL), None]
        await _across(cluster, home=1, other=0, key="mixed-old-to-new")
        await _across(cluster, home=0, other=1, key="mixed-new-to-old")
        await _upgrade(cluster, 1)  # both new
        await _across(cluster, home=0, other=1, key="upgraded")
    finally:
        await cluster.stop()
