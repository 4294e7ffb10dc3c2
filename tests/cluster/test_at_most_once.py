"""At most once through a real balancer (RETRY-1..RETRY-3, IDEM-4): HAProxy and nginx in front of
two ``rollout serve`` nodes sharing a redis-server, the openai SDK with its default 2 retries.

The terminal write is failed for real: the test revokes ``SET`` from the nodes' Redis user
(``ACL SETUSER default -set``) once the model runs, so the write fails after the model ran and
billed. The answer is a 500 with ``x-should-retry: false``: neither the balancer nor the SDK
sends it again. Model runs are counted in the nodes' JSONL ledger (one file, both nodes append;
every run that produced output is billed, POST-5), read after the cluster stopped and drained,
not in any in-memory window.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import redis.asyncio as aioredis
from openai import AsyncOpenAI

from cli.launcher import Cluster
from tests.cluster.conftest import cluster_spec
from tests.support.wait import wait_for

SLOW = "bench-text/40"  # 40 tokens at 20 tokens/s: about two seconds of generation
CRASHED = "bench-text/2000"  # 100 s: still generating whenever the kill lands
KEY = {"Idempotency-Key": "job-42-step-7"}


@pytest.fixture(params=["haproxy", "nginx"])
async def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Cluster]:
    ledger = tmp_path / "ledger.jsonl"
    spec = cluster_spec(
        tmp_path, request.param, "--bench-models", "--tps", "20", "--ledger", str(ledger)
    )
    running = Cluster(spec)
    await running.start()
    try:
        yield running
    finally:
        await running.stop()


async def _acl(admin: aioredis.Redis, rule: str) -> None:
    command: Any = admin.execute_command  # redis-py leaves it untyped
    await command("ACL", "SETUSER", "default", rule)


async def _resolutions(cluster: Cluster) -> list[int]:
    """Creates each running node has routed to a model (``/debug/stats``, HTTP-7)."""
    out = []
    async with aiohttp.ClientSession() as http:
        for node in cluster.nodes:
            async with http.get(f"http://127.0.0.1:{node.port}/debug/stats") as resp:
                out.append(int((await resp.json())["router_resolutions"]))
    return out


async def _crash_mid_request(cluster: Cluster, sdk: AsyncOpenAI) -> None:
    """RETRY-3, IDEM-4: the node running a non-streaming create is killed (SIGKILL) while its
    model runs; the balancer sends the request nowhere else (HAProxy without
    ``empty-response``, nginx without ``non_idempotent``). nginx answers 502 with
    ``x-should-retry: false``, which the SDK obeys. HAProxy, on a client connection that already
    carried a request, closes it without an answer (its ``abort_keep_alive``), and the SDK
    retries a dropped connection by itself: the Idempotency-Key makes that retry harmless, the
    survivor answers 409 ``idempotency_key_in_use`` (the entry is ``running``) and runs nothing.
    Either way the surviving node never routes the create to a model."""
    before = await _resolutions(cluster)
    key = {"Idempotency-Key": "job-42-step-9"}
    create = asyncio.create_task(
        sdk.responses.create(model=CRASHED, input="go", store=False, extra_headers=key)
    )
    running: list[int] = []

    async def started() -> bool:
        now = await _resolutions(cluster)
        running[:] = [i for i, (a, b) in enumerate(zip(now, before, strict=True)) if a != b]
        return bool(running)

    await wait_for(started, "a node to run the create")
    (victim,) = running
    proc = cluster.nodes[victim].proc
    assert proc is not None
    proc.kill()
    await proc.wait()
    cluster.nodes[victim].proc = None
    with pytest.raises(openai.APIStatusError) as info:
        await create
    if isinstance(info.value, openai.ConflictError):
        assert info.value.code == "idempotency_key_in_use"
    else:
        assert info.value.status_code == 502
        assert info.value.response.headers.get("x-should-retry") == "false"
    survivor = 1 - victim
    assert (await _resolutions_of(cluster, survivor)) == before[survivor]


async def _resolutions_of(cluster: Cluster, index: int) -> int:
    async with aiohttp.ClientSession() as http:
        url = f"http://127.0.0.1:{cluster.nodes[index].port}/debug/stats"
        async with http.get(url) as resp:
            return int((await resp.json())["router_resolutions"])


@pytest.mark.timeout(300)
async def test_a_5xx_after_work_is_run_once_and_billed_once(cluster: Cluster) -> None:
    admin = aioredis.Redis.from_url(cluster.spec.store)
    sdk = AsyncOpenAI(base_url=cluster.url, api_key="x", max_retries=2)
    plain = AsyncOpenAI(base_url=cluster.url, api_key="x", max_retries=0)
    try:
        # An idempotent create: the key is claimed, the model runs, then SET is revoked.
        keyed = asyncio.create_task(
            sdk.responses.create(model=SLOW, input="go", store=True, extra_headers=KEY)
        )

        async def claimed() -> bool:
            return bool([key async for key in admin.scan_iter(match="rollout:response:idem:*")])

        await wait_for(claimed, "the key to be claimed")
        await _acl(admin, "-set")
        with pytest.raises(openai.InternalServerError) as info:
            await keyed
        assert info.value.status_code == 500 and info.value.code == "store_unavailable"
        assert info.value.response.headers.get("x-should-retry") == "false"
        # A create without a key, answered the same way: not sent again either.
        with pytest.raises(openai.InternalServerError) as bare:
            await sdk.responses.create(model=SLOW, input="go", store=True)
        assert bare.value.response.headers.get("x-should-retry") == "false"
        await _acl(admin, "+set")
        # The key's outcome could not be stored: a repeat is refused, never run (IDEM-4).
        with pytest.raises(openai.ConflictError) as conflict:
            await plain.responses.create(model=SLOW, input="go", store=True, extra_headers=KEY)
        assert conflict.value.code == "idempotency_key_in_use"
        # An idempotent retry of a completed create bills once (IDEM-4), on either node.
        other = {"Idempotency-Key": "job-42-step-8"}
        done = await sdk.responses.create(model=SLOW, input="go", store=True, extra_headers=other)
        for _ in range(3):
            again = await plain.responses.create(
                model=SLOW, input="go", store=True, extra_headers=other
            )
            assert again.id == done.id
        await _crash_mid_request(cluster, sdk)
    finally:
        await _acl(admin, "+set")
        await admin.aclose()
        await sdk.close()
        await plain.close()
    await cluster.stop()  # the nodes drain their ledgers
    ledger = Path(cluster.spec.serve_args[-1])
    text = await asyncio.to_thread(ledger.read_text)
    records = [json.loads(line) for line in text.splitlines()]
    assert len(records) == 3, records  # the crashed request was billed nowhere, run nowhere else
    assert len({rid for r in records for rid in r["response_ids"]}) == 3
