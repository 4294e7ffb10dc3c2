"""Rate limits across nodes (RATE-7): two servers on one real ``redis-server`` count one key's
requests and concurrent responses together; the check and the count are one Lua call."""

from __future__ import annotations

import asyncio
import sys

import aiohttp

from engine.server.transport.server_config import ServerConfig
from engine.store.ratelimits import Limits
from engine.store.redis import RedisStore
from tests.store._procs import RedisServer
from tests.support.server import LiveServer, start_server, stdout_port

KEY = "sk-shared"
DAY = 86400.0  # windows are clock-aligned: a day's one holds the whole test


async def create(http: aiohttp.ClientSession, live: LiveServer) -> tuple[int, dict[str, str]]:
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {"model": "sim", "input": "hi", "store": False}
    async with http.post(f"{live.base_url}/responses", json=body, headers=headers) as resp:
        await resp.read()
        return resp.status, dict(resp.headers)


async def test_two_nodes_share_one_window(redis_server: RedisServer) -> None:
    config = ServerConfig(
        api_keys=frozenset({KEY}), key_limits={KEY: {"requests": 3}}, rate_window_s=DAY
    )
    nodes = [
        await start_server(store=RedisStore(redis_server.url), server=config) for _ in range(2)
    ]
    try:
        async with aiohttp.ClientSession() as http:
            answers = [await create(http, node) for node in (*nodes, nodes[0], nodes[1])]
    finally:
        for node in nodes:
            await node.runner.cleanup()
    statuses = [status for status, _ in answers]
    assert statuses == [200, 200, 200, 429]  # the fourth is over, whichever node it reached
    remaining = [headers["x-ratelimit-remaining-requests"] for _, headers in answers]
    assert remaining == ["2", "1", "0", "0"]
    assert answers[3][1]["x-ratelimit-limit-requests"] == "3"


async def test_concurrency_leases(redis_server: RedisServer) -> None:
    """A lease holds a slot until it is given back; the tokens it settles count."""
    store = RedisStore(redis_server.url)
    await store.open()
    try:
        counters = store.cluster.limits
        limits = Limits(concurrent=1, tokens=100)
        first = await counters.admit("bucket", limits, DAY, "lease-1")
        second = await counters.admit("bucket", limits, DAY, "lease-2")
        assert (first.refused, first.active) == ("", 1)
        assert second.refused == "concurrent"
        await counters.settle("bucket", DAY, 100, "lease-1")
        standing = await counters.peek("bucket", DAY)
        assert (standing.active, standing.tokens) == (0, 100)
        third = await counters.admit("bucket", limits, DAY, "lease-3")
        assert third.refused == "tokens"  # the window's tokens are spent
    finally:
        await store.close()


async def test_a_pool_on_redis_is_not_warned_of_per_worker_limits(
    redis_server: RedisServer,
) -> None:
    """LIVE-6, RATE-7: on Redis every worker counts in one window, so ``--workers 2`` with rate
    limits starts without the per-worker warning a per-process store gets (the parent checks
    the store's port before any worker opened it)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cli", "serve", "--port", "0", "--announce-port",
        "--workers", "2", "--tps", "0", "--log-level", "WARNING", "--store", redis_server.url,
        "--rate-requests", "5",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        await stdout_port(proc, 60)
    finally:
        proc.kill()
        await proc.wait()
    assert proc.stderr is not None
    err = (await proc.stderr.read()).decode()
    assert "counted per worker" not in err, err
