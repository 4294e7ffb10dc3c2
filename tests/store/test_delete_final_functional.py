"""HYD-5, STORE-11: a delete is final on every node even when it never reaches one. Two real
``rollout serve`` processes share a real Redis; the delete-channel subscribers are dropped
(``CLIENT KILL TYPE pubsub``) just before a delete made through A, so B, resubscribing a
second later, never hears of it. B must still refuse to continue the deleted response, from its
hydration cache and from a parked rollout alike.

redis-py resubscribes at once after a dropped connection, so B's Redis user loses its channel
permission while the delete is published (``ACL SETUSER … resetchannels``): its resubscription
is refused and it misses exactly the delete, as a subscriber cut off by a network fault would.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, cast

import aiohttp
import redis.asyncio as aioredis

from tests.store._chain import body, http_create, ws_create
from tests.store._procs import RedisServer, ServeProcess

Serve = Callable[..., Awaitable[ServeProcess]]


def _as_user(url: str, user: str) -> str:
    return url.replace("redis://", f"redis://{user}:pw-{user}@", 1)


async def _redis(url: str, *command: str) -> Any:
    client = aioredis.Redis.from_url(url)
    try:
        return await client.execute_command(*command)  # type: ignore[no-untyped-call]
    finally:
        await client.aclose()


async def _two_nodes(redis: RedisServer, serve: Serve) -> tuple[ServeProcess, ServeProcess]:
    for user in ("node_a", "node_b"):
        await _redis(redis.url, "ACL", "SETUSER", user, "on", f">pw-{user}", "~*", "&*", "+@all")
    return await serve(_as_user(redis.url, "node_a")), await serve(_as_user(redis.url, "node_b"))


class _DeafNode:
    """While inside: node B's delete subscriber is dropped and cannot come back."""

    def __init__(self, redis: RedisServer) -> None:
        self.url = redis.url

    async def __aenter__(self) -> None:
        await _redis(self.url, "ACL", "SETUSER", "node_b", "resetchannels")
        await _redis(self.url, "CLIENT", "KILL", "TYPE", "pubsub", "USER", "node_b")
        clients = await _redis(self.url, "CLIENT", "LIST", "TYPE", "pubsub")
        assert b"user=node_b" not in clients and b"user=node_a" in clients

    async def __aexit__(self, *exc: object) -> None:
        await _redis(self.url, "ACL", "SETUSER", "node_b", "allchannels")


async def _stats(http: aiohttp.ClientSession, server: ServeProcess) -> dict[str, Any]:
    async with http.get(f"{server.base}/debug/stats") as resp:
        return cast(dict[str, Any], await resp.json())


async def _delete(http: aiohttp.ClientSession, server: ServeProcess, rid: str) -> None:
    async with http.delete(f"{server.base}/v1/responses/{rid}") as resp:
        assert resp.status == 200, await resp.text()


async def test_missed_delete_is_not_served_from_the_hydration_cache(
    redis_server: RedisServer, serve: Serve
) -> None:
    a, b = await _two_nodes(redis_server, serve)
    async with aiohttp.ClientSession() as http:
        first = await http_create(http, b.base, body(None, 0))
        assert first.response is not None
        assert (await _stats(http, b))["hydration_cache"]["entries"] == 1  # B holds its context
        async with _DeafNode(redis_server):
            await _delete(http, a, first.id)
        # The delete never reached B: its cache still holds the context.
        assert (await _stats(http, b))["hydration_cache"]["entries"] == 1
        reply = await http_create(http, b.base, body(first.response, 1))
        assert (reply.status, reply.code) == (400, "previous_response_not_found")
        async with http.get(f"{b.base}/v1/responses/{first.id}") as resp:
            assert resp.status == 404
        assert (await _stats(http, b))["hydration_cache"]["entries"] == 0  # dropped on the miss


async def test_missed_delete_does_not_resume_a_parked_rollout(
    redis_server: RedisServer, serve: Serve
) -> None:
    a, b = await _two_nodes(redis_server, serve)
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(b.ws_url) as ws:
            first = await ws_create(ws, body(None, 0))  # a tool call: the rollout suspends
            assert first.response is not None
        for _ in range(200):  # the socket's close parks the rollout (PARK-1)
            if (await _stats(http, b))["parked"] == 1:
                break
        assert (await _stats(http, b))["parked"] == 1
        async with _DeafNode(redis_server):
            await _delete(http, a, first.id)
        assert (await _stats(http, b))["parked"] == 1  # B never heard of the delete
        async with http.ws_connect(b.ws_url) as ws:
            reply = await ws_create(ws, body(first.response, 1))
        assert reply.code == "previous_response_not_found"
        assert (await _stats(http, b))["parked"] == 0  # claimed, found deleted, retired
