"""``redis://HOST:PORT/DB`` and ``rediss://…``: the store shared by many processes and hosts
(STORE-10), over redis-py's asyncio client with the hiredis parser. Valkey works the same.

A write is one transaction (``MULTI``: ``SET … EX`` plus ``EXPIRE … GT`` on the records its
context needs), a hydration one ``MGET``. Timeouts are short and a failed command is retried once
on a fresh connection (a restarted server leaves stale pooled sockets), so an outage turns into
prompt ``store_unavailable`` errors and the next request after the server returns succeeds
(STORE-8). Deletes are published on a channel so every process drops the response from its
caches (STORE-11). How much a Redis crash can lose is Redis's own setting (``appendfsync``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Sequence
from typing import Any, cast

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from engine.store.base import (
    DEFAULT_MAX_RECORD_BYTES,
    DEFAULT_TTL_S,
    ResponseStore,
    StoreUnavailable,
)

log = logging.getLogger("rollout.store.redis")

KEY_PREFIX = "rollout:response:"
DELETED_CHANNEL = "rollout:deleted"
CONNECT_TIMEOUT_S = 2.0
COMMAND_TIMEOUT_S = 5.0
RESUBSCRIBE_AFTER_S = 1.0


class RedisStore(ResponseStore):
    kind = "redis"

    def __init__(
        self,
        url: str,
        ttl_s: float = DEFAULT_TTL_S,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    ) -> None:
        super().__init__(ttl_s, max_record_bytes)
        self.url = url
        self._client: aioredis.Redis | None = None
        self._listener: asyncio.Task[None] | None = None

    async def open(self) -> None:
        """Connects lazily: a Redis that is down at start only makes requests fail (STORE-8)."""
        if self._client is not None:
            return
        self._client = _client(self.url, COMMAND_TIMEOUT_S)
        self._listener = asyncio.create_task(self._listen(), name="store-redis-deletes")
        await self.health()

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener
            self._listener = None
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    # ------------------------------------------------------------------ primitives
    async def _write(
        self, key: str, blob: bytes, links: Sequence[str], refresh: bool, expires_at: float | None
    ) -> None:
        at_ms = None if expires_at is None else int(expires_at * 1000)

        async def op(client: aioredis.Redis) -> None:
            if not refresh:  # the usual turn: one command
                await client.set(KEY_PREFIX + key, blob, pxat=at_ms)
                return
            async with client.pipeline(transaction=True) as pipe:
                pipe.set(KEY_PREFIX + key, blob, pxat=at_ms)
                for link in links:  # the records our context needs live as long as we do
                    if at_ms is None:
                        pipe.persist(KEY_PREFIX + link)
                    else:
                        pipe.pexpireat(KEY_PREFIX + link, at_ms, gt=True)
                await pipe.execute()

        await self._call(op)

    async def _read(self, keys: Sequence[str]) -> list[bytes | None]:
        async def op(client: aioredis.Redis) -> list[bytes | None]:
            blobs: list[bytes | None] = await client.mget([KEY_PREFIX + key for key in keys])
            return blobs

        blobs: list[bytes | None] = await self._call(op)
        return blobs

    async def _replace(self, key: str, blob: bytes) -> None:
        async def op(client: aioredis.Redis) -> None:
            async with client.pipeline(transaction=True) as pipe:
                pipe.set(KEY_PREFIX + key, blob, xx=True, keepttl=True)
                pipe.publish(DELETED_CHANNEL, key)
                await pipe.execute()

        await self._call(op)

    async def _remove(self, key: str) -> bool:
        async def op(client: aioredis.Redis) -> bool:
            async with client.pipeline(transaction=True) as pipe:
                pipe.delete(KEY_PREFIX + key)
                pipe.publish(DELETED_CHANNEL, key)
                removed, _ = await pipe.execute()
            return bool(removed)

        removed: bool = await self._call(op)
        return removed

    async def _ping(self) -> None:
        async def op(client: aioredis.Redis) -> None:
            await cast(Awaitable[bool], client.ping())

        await self._call(op)

    async def _call(self, op: Any) -> Any:
        if self._client is None:
            raise StoreUnavailable("the Redis store is not open")
        try:
            return await op(self._client)
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(f"{type(exc).__name__}: {exc}") from None

    # ------------------------------------------------------------------ deletes elsewhere
    async def _listen(self) -> None:
        """Deletes made by any process reach this one's caches; resubscribes after outages."""
        while True:
            client = _client(self.url, None)  # a subscriber waits indefinitely for messages
            try:
                async with client.pubsub(ignore_subscribe_messages=True) as pubsub:
                    await pubsub.subscribe(DELETED_CHANNEL)
                    async for message in pubsub.listen():
                        data = message.get("data")
                        if isinstance(data, bytes):
                            self.notify_deleted(data.decode())
            except (RedisError, OSError) as exc:
                log.debug("redis store: delete channel lost (%s); resubscribing", exc)
            finally:
                await client.aclose()
            await asyncio.sleep(RESUBSCRIBE_AFTER_S)


def _client(url: str, timeout: float | None) -> aioredis.Redis:
    client: aioredis.Redis = aioredis.Redis.from_url(
        url,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        socket_timeout=timeout,
        retry=Retry(NoBackoff(), 1),  # once, on a fresh connection: stale sockets after restarts
        health_check_interval=30,
    )
    return client
