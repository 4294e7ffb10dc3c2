"""STORE-10, STORE-11: two ``rollout serve`` processes on one shared store (Redis, then Postgres).
A chain alternates between them over HTTP and over WebSocket; a delete through one is seen by
the other, caches included (Redis publishes it, Postgres notifies it)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import aiohttp
import pytest

from tests.store._chain import Chain, body, http_create, ws_create
from tests.store._procs import RedisServer, ServeProcess
from tests.support.wait import wait_for

Serve = Callable[..., Awaitable[ServeProcess]]


@pytest.fixture(params=["redis", "postgres"])
def shared_url(request: pytest.FixtureRequest) -> str:
    if request.param == "postgres":
        url: str = request.getfixturevalue("postgres_url")
        return url
    redis: RedisServer = request.getfixturevalue("redis_server")
    return redis.url


async def test_chain_alternates_between_two_processes(shared_url: str, serve: Serve) -> None:
    a, b = await serve(shared_url), await serve(shared_url)
    chain = Chain()
    async with aiohttp.ClientSession() as http:
        for step in range(6):  # HTTP: A, B, A, B …
            server = (a, b)[step % 2]
            chain.accept(await http_create(http, server.base, body(chain.last, step)))
        for step in range(6, 12):  # WebSocket: a new socket on the other process every turn
            server = (a, b)[step % 2]
            async with http.ws_connect(server.ws_url) as ws:
                chain.accept(await ws_create(ws, body(chain.last, step)))
        for server in (a, b):
            async with http.get(f"{server.base}/v1/responses/{chain.acked[0]['id']}") as resp:
                assert resp.status == 200


async def test_delete_on_one_process_reaches_the_other(shared_url: str, serve: Serve) -> None:
    a, b = await serve(shared_url), await serve(shared_url)
    chain = Chain()
    async with aiohttp.ClientSession() as http, http.ws_connect(b.ws_url) as ws:
        chain.accept(await ws_create(ws, body(None, 0)))  # now in B's connection cache too
        rid = chain.acked[0]["id"]
        async with http.delete(f"{a.base}/v1/responses/{rid}") as resp:
            assert resp.status == 200 and (await resp.json())["deleted"] is True
        for server in (a, b):
            async with http.get(f"{server.base}/v1/responses/{rid}") as resp:
                assert resp.status == 404

        # B's socket had it cached: the published delete evicts it there (CACHE counters).
        async def evicted() -> bool:
            async with http.get(f"{b.base}/debug/stats") as resp:
                return bool((await resp.json())["counters"].get("cache.evicted") == 1)

        await wait_for(evicted, "B to evict the deleted response")
        reply = await ws_create(ws, body(chain.last, 1))
        assert reply.code == "previous_response_not_found"
