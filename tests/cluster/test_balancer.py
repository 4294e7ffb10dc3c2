"""Clients through a real load balancer (CLUSTER-1..CLUSTER-4): the openai SDK over HTTP, SSE
and ``responses.connect()`` WebSockets, the Agents SDK and the Codex CLI, in front of two
``rollout serve`` nodes sharing a redis-server. A ``store: true`` chain continues on whichever
node the balancer picks, including after the node that made it has stopped."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from openai import AsyncOpenAI

from cli.launcher import Cluster
from tests.cluster.conftest import cluster_spec, node_counters
from tests.support.tools import WEATHER

MODEL = "gpt-x"


def call_output(call_id: str, output: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": output}


async def _which_node(cluster: Cluster, before: list[dict[str, Any]]) -> int:
    after = await node_counters(cluster)
    moved = [i for i, (a, b) in enumerate(zip(after, before, strict=True)) if a != b]
    assert len(moved) == 1, (before, after)
    return moved[0]


async def test_store_true_chain_crosses_nodes(cluster: Cluster) -> None:
    """CLUSTER-2, WORK-4, HYD-1, DRAIN-1: an HTTP tool turn on one node; that node stops (it
    drains and leaves the balancer's rotation); the balancer sends the continuation, over HTTP
    and then over a WebSocket, to the other node, which continues the chain from Redis."""
    sdk = AsyncOpenAI(base_url=cluster.url, api_key="x", max_retries=0)
    try:
        before = await node_counters(cluster)
        first = await sdk.responses.create(
            model=MODEL, input="Weather in Paris?", tools=[WEATHER], store=True
        )
        call = first.output[0]
        assert call.type == "function_call"
        owner = await _which_node(cluster, before)
        await cluster.nodes[owner].stop()
        second = await sdk.responses.create(
            model=MODEL, previous_response_id=first.id, tools=[WEATHER],
            input=[call_output(call.call_id, "sunny")], store=True,
        )  # fmt: skip
        assert second.output_text == "Based on the tool results: sunny"
        async with sdk.responses.connect() as conn:
            await conn.response.create(
                model=MODEL, previous_response_id=second.id, input="And tomorrow?", store=True
            )
            async for event in conn:
                if event.type in ("response.completed", "error", "response.failed"):
                    break
        assert event.type == "response.completed", event
        third = event.response
        other = next(n for n in cluster.nodes if n.proc is not None)
        counters = (await node_counters(cluster))[cluster.nodes.index(other)]
        assert counters.get("hydration.miss", 0) >= 1  # its first sight of the chain: Redis
        await cluster.nodes[owner].start()  # back, and the whole chain is readable from it too
        for response_id in (first.id, second.id, third.id):
            got = await sdk.responses.retrieve(response_id)
            assert got.status == "completed"
    finally:
        await sdk.close()


async def test_ws_tool_loop_and_sse_through_the_balancer(cluster: Cluster) -> None:
    """CLUSTER-3, WS-1, HTTP-3: the WebSocket upgrade passes the balancer and one socket carries
    a whole tool loop (the fast path: the same node, the same coroutine); SSE events stream
    through unbuffered, in order, ending with exactly one terminal."""
    sdk = AsyncOpenAI(base_url=cluster.url, api_key="x", max_retries=0)
    try:
        async with sdk.responses.connect() as conn:
            await conn.response.create(
                model=MODEL, input="Weather in Oslo?", tools=[WEATHER], store=False
            )
            first = await _completed(conn)
            call = first.output[0]
            await conn.response.create(
                model=MODEL, previous_response_id=first.id, tools=[WEATHER], store=False,
                input=[call_output(call.call_id, "rain")],
            )  # fmt: skip
            second = await _completed(conn)
        assert second.output_text == "Based on the tool results: rain"
        assert sum(c.get("create.fast_path", 0) for c in await node_counters(cluster)) == 1
        stream = await sdk.responses.create(model=MODEL, input="Say hi", stream=True)
        events = [event async for event in stream]
        assert [e.sequence_number for e in events] == list(range(len(events)))
        assert [e.type for e in events].count("response.completed") == 1
        assert events[-1].type == "response.completed"
    finally:
        await sdk.close()


async def _completed(conn: Any) -> Any:
    async for event in conn:
        if event.type in ("response.completed", "error", "response.failed"):
            assert event.type == "response.completed", event
            return event.response
    raise AssertionError("the socket closed before response.completed")


async def test_agents_sdk_through_the_balancer(cluster: Cluster) -> None:
    """CLUSTER-3: the Agents SDK's WebSocket session and its HTTP model, each a full tool run."""
    from agents import Runner, responses_websocket_session
    from agents.models.openai_responses import OpenAIResponsesModel

    from tests.support.agents_sdk import weather_agent

    calls: list[str] = []
    async with responses_websocket_session(base_url=cluster.url, api_key="x") as ws:
        result = await ws.run(weather_agent(calls), "What is the weather in Paris?")
    assert result.final_output == "Based on the tool results: sunny in Paris"
    sdk = AsyncOpenAI(base_url=cluster.url, api_key="x", max_retries=0)
    try:
        model = OpenAIResponsesModel(model=MODEL, openai_client=sdk)
        result = await Runner.run(weather_agent(calls, model=model), "Weather in Madrid?")
    finally:
        await sdk.close()
    assert result.final_output == "Based on the tool results: sunny in Madrid"
    assert calls == ["Paris", "Madrid"]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def codex_cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Cluster]:
    """One HAProxy cluster for the four Codex runs: each only reads it (a fresh Codex home and
    its own stored chain) and counts the sockets it opened itself, so one start serves all."""
    running = Cluster(cluster_spec(tmp_path_factory.mktemp("codex-cluster"), "haproxy"))
    await running.start()
    try:
        yield running
    finally:
        await running.stop()


def _sockets_opened(counters: list[dict[str, Any]]) -> int:
    return sum(c.get("ws.connections", 0) for c in counters)


@pytest.mark.asyncio(loop_scope="module")  # the module's cluster lives on the module's loop
@pytest.mark.timeout(300)
@pytest.mark.parametrize("websockets", [True, False], ids=["ws", "http"])
@pytest.mark.parametrize("newest", [False, True], ids=["pinned", "newest"])
async def test_codex_through_haproxy(
    codex_cluster: Cluster, tmp_path: Path, websockets: bool, newest: bool
) -> None:
    """CLUSTER-3, CODEX-1..CODEX-3, CODEX-20: the pinned and the newest Codex CLI's two-tool
    task through HAProxy, over its WebSocket transport and over HTTP/SSE; the answer needs both
    tools' real outputs. Its own WebSockets: at least one, or none over HTTP."""
    from tests.conformance.codex import MARKER, NEWEST, PINNED, CodexTask, exec_codex

    task = CodexTask(build=NEWEST if newest else PINNED)
    before = _sockets_opened(await node_counters(codex_cluster))
    done = await exec_codex(codex_cluster.url, tmp_path, websockets, task)
    assert done.returncode == 0, done.stderr[-3000:]
    assert MARKER in done.answer, done.answer
    assert '"goal":null' in done.answer, done.answer
    assert done.proxy_attempts == []
    counters = await node_counters(codex_cluster)
    opened = _sockets_opened(counters) - before
    assert (opened >= 1) if websockets else (opened == 0), json.dumps(counters)
