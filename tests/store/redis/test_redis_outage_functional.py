"""STORE-8: the shared store's server (Redis, then Postgres) stopped and restarted under traffic.
Requests that need the store get ``store_unavailable`` (HTTP: 503 when refused before any work,
500 when the model ran and the terminal write failed, RETRY-1/RETRY-2) or an ``error`` event
(WebSocket, the socket stays up), nothing acknowledged is lost, ``store: false`` keeps working,
and service resumes by itself."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import aiohttp
import pytest

from clients.bench.services.pg_cluster import PostgresCluster
from engine.core import Engine, EngineConfig
from engine.store import ResponseStore
from engine.store.postgres import PostgresStore
from engine.store.redis import RedisStore
from tests.store._chain import Chain, Reply, body, fork_from, http_create, ws_create
from tests.store._procs import RedisServer, ServeProcess
from tests.support.server import LiveServer, start_server
from tests.support.wait import wait_for

# store_unavailable's statuses: 503 refused before any work, 500 after the model ran (RETRY-2)
UNSTORED = (503, 500)

Serve = Callable[..., Awaitable[ServeProcess]]
Action = Callable[[], Awaitable[None]]


@dataclass(frozen=True)
class Outage:
    """A shared store's server and what a test does to it."""

    kind: str  # as /debug/stats reports it
    url: str
    stop: Action  # a clean shutdown
    crash: Action  # gone at once (kill -9, Postgres's immediate shutdown)
    start: Action
    store: Callable[[], ResponseStore]  # an in-process client of it


@pytest.fixture(params=["redis", "postgres"])
def outage(request: pytest.FixtureRequest) -> Outage:
    if request.param == "redis":
        redis: RedisServer = request.getfixturevalue("redis_server")
        return Outage(
            "redis", redis.url, redis.stop, redis.kill, redis.start, lambda: RedisStore(redis.url)
        )
    cluster: PostgresCluster = request.getfixturevalue("postgres_cluster")
    url: str = request.getfixturevalue("postgres_url")
    request.addfinalizer(cluster.ensure_running)  # for the session's next tests

    def run(step: Callable[[], None]) -> Action:
        return lambda: asyncio.to_thread(step)

    return Outage(
        "postgres", url, run(cluster.stop), run(cluster.crash), run(cluster.start),
        lambda: PostgresStore(url),
    )  # fmt: skip


async def _until_served(make: Callable[[], Awaitable[Reply]]) -> Reply:
    """The first request the recovered store serves; until then only store_unavailable."""

    async def served() -> Reply | None:
        reply = await make()
        if reply.status == 200:
            return reply
        assert reply.code == "store_unavailable" and reply.status in UNSTORED, reply
        return None

    reply = await wait_for(served, "the store to come back")
    assert isinstance(reply, Reply)
    return reply


async def _store_state(http: aiohttp.ClientSession, server: ServeProcess) -> object:
    async with http.get(f"{server.base}/debug/stats") as resp:
        return (await resp.json())["store"]


async def _traffic(server: ServeProcess, stop: asyncio.Event, seen: list[Reply]) -> Chain:
    """A chain that keeps going through the outage; errors must be store_unavailable only."""
    chain = Chain()
    async with aiohttp.ClientSession() as http:
        while not stop.is_set():
            reply = await http_create(http, server.base, body(chain.last, len(chain.acked)))
            seen.append(reply)
            if reply.status == 200:
                chain.accept(reply)
            else:
                assert reply.code == "store_unavailable" and reply.status in UNSTORED, reply
                await asyncio.sleep(0.01)  # pacing the retries, not a wait for a state
    return chain


async def test_outage_then_recovery_without_restart(outage: Outage, serve: Serve) -> None:
    server = await serve(outage.url, "--tps", "2000")
    stop, seen = asyncio.Event(), list[Reply]()
    background = asyncio.create_task(_traffic(server, stop, seen))
    chain = Chain()
    async with aiohttp.ClientSession() as http, http.ws_connect(server.ws_url) as ws:
        for step in range(3):
            chain.accept(await http_create(http, server.base, body(chain.last, step)))
        await outage.stop()
        down = await http_create(http, server.base, body(chain.last, 3))
        assert down.code == "store_unavailable" and down.status in UNSTORED
        fresh = await http_create(http, server.base, body(None, 0))
        assert fresh.code == "store_unavailable" and fresh.status in UNSTORED
        async with http.get(f"{server.base}/v1/responses/{chain.acked[0]['id']}") as resp:
            assert resp.status == 503
            assert resp.headers.get("x-should-retry") == "true"  # nothing was done (RETRY-1)
            assert (await resp.json())["error"]["code"] == "store_unavailable"
        on_ws = await ws_create(ws, body(chain.last, 3))
        assert on_ws.code == "store_unavailable" and on_ws.status in UNSTORED
        local = await ws_create(ws, body(None, 0, store=False))  # same socket, still served
        assert local.response is not None and local.response["status"] == "completed"
        assert await _store_state(http, server) == {"kind": outage.kind, "available": False}
        await outage.start()
        reply = await _until_served(lambda: http_create(http, server.base, body(chain.last, 3)))
        chain.accept(reply)
        chain.accept(await ws_create(ws, body(chain.last, 4)))
        assert await _store_state(http, server) == {"kind": outage.kind, "available": True}
        stop.set()
        traffic = await asyncio.wait_for(background, 60)
        assert any(r.status in UNSTORED for r in seen), "the outage was seen by the traffic"
        for response in chain.acked + traffic.acked:  # nothing acknowledged was lost
            await fork_from(http, server.base, response)


@pytest.fixture
async def slow_server(outage: Outage) -> AsyncIterator[LiveServer]:
    """In process, paced: the store is up when a response starts, down when it ends."""
    live = await start_server(EngineConfig(tokens_per_second=40), store=outage.store())
    try:
        yield live
    finally:
        await live.runner.cleanup()


async def test_store_lost_mid_response_replaces_the_terminal_frame(
    outage: Outage, slow_server: LiveServer
) -> None:
    engine: Engine = slow_server.engine
    async with aiohttp.ClientSession() as http, http.ws_connect(slow_server.ws_url) as ws:
        await ws.send_str(json.dumps({"type": "response.create", "input": "tell me a story"}))
        first = json.loads((await ws.receive(timeout=10)).data)
        assert first["type"] == "response.created"
        await outage.crash()  # the model is still writing
        types = []
        while True:
            event = json.loads((await ws.receive(timeout=30)).data)
            types.append(event["type"])
            if event["type"] in ("error", "response.completed"):
                break
        assert event["type"] == "error" and event["error"]["code"] == "store_unavailable"
        assert event["status"] == 500  # the model ran: never a 503 (RETRY-2)
        rid = first["response"]["id"]
        reply = await ws_create(ws, {"input": "again", "previous_response_id": rid})
        assert reply.code in ("store_unavailable", "previous_response_not_found")
        local = await ws_create(ws, {"input": "hi", "store": False})  # the socket is fine
        assert local.response is not None
        await outage.start()
        assert await engine.store.get(rid) is None  # never acknowledged, never stored
        reply = await ws_create(ws, {"input": "again", "previous_response_id": rid})
        assert reply.code == "previous_response_not_found"  # not in this socket's cache either


async def test_store_lost_mid_sse_stream_ends_it_with_an_error(
    outage: Outage, slow_server: LiveServer
) -> None:
    """HTTP with ``stream: true``: the status line is long sent, so the error is the last SSE
    event, in place of ``response.completed`` (STORE-8)."""
    url = f"{slow_server.base_url}/responses"
    async with (
        aiohttp.ClientSession() as http,
        http.post(url, json={"input": "tell me a story", "stream": True}) as resp,
    ):
        assert resp.status == 200
        events: list[dict[str, object]] = []
        async for line in resp.content:
            if line.startswith(b"data: "):
                events.append(json.loads(line[6:]))
                if len(events) == 1:
                    await outage.crash()  # the model is still writing
    assert events[0]["type"] == "response.created"
    assert events[-1]["type"] == "error" and events[-1]["error"]["code"] == "store_unavailable"
    assert not any(e["type"] == "response.completed" for e in events)
