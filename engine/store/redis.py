"""``redis://HOST:PORT/DB`` and ``rediss://…``: the store shared by many processes and hosts
(STORE-10), over redis-py's asyncio client with the hiredis parser. Valkey works the same.

A turn's write is one ``SET … PXAT`` (a ``MULTI`` transaction with ``PEXPIREAT … GT`` on the
records its context needs when their expiry must be extended), a hydration one ``MGET``. The
common write goes over a *lane* when it is free: one dedicated redis-py ``Connection`` used
directly, skipping the pool and client layers that cost more than the round trip itself
(STORE-14); everything else, and a write that finds the lane busy, uses the pooled client.
Timeouts are short and a failed command is retried once on a fresh connection (a restarted
server leaves stale sockets), so an outage turns into prompt ``store_unavailable`` errors and the
next request after the server returns succeeds (STORE-8). Deletes are published on a channel so
every process drops the response from its caches (STORE-11). How much a Redis crash can lose is
Redis's own setting (``appendfsync``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Sequence
from typing import Any, cast

import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection, BlockingConnectionPool, ConnectionPool
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from engine.store.cluster_state import ClusterState, RecordBlobs
from engine.store.framing import MAX_HEAD
from engine.store.ratelimits import RedisCounters
from engine.store.records import (
    DEFAULT_MAX_RECORD_BYTES,
    DEFAULT_TTL_S,
    ResponseStore,
    StoreUnavailable,
)

log = logging.getLogger("rollout.store.redis")

KEY_PREFIX = "rollout:response:"
DELETED_CHANNEL = "rollout:deleted"
SALT_KEY = "rollout:owner_salt"  # the owner digests' salt, created once, never expires (OWN-6)
CONTINUED_CHANNEL = "rollout:continued"  # continued elsewhere: retire a parked copy (PARK-9)
PARKED_PREFIX = "rollout:parked:"  # a parked rollout's node address, for its hand-over (PARK-20)
MAX_NOTICE_BYTES = 256  # a longer message on either channel is no response id: ignored
CONNECT_TIMEOUT_S = 2.0
COMMAND_TIMEOUT_S = 5.0
POOL_CONNECTIONS = 64  # pooled sockets per process, besides the write lane and the subscriber
RESUBSCRIBE_AFTER_S = 1.0
# Delete a claim only while it holds the releasing holder's value, atomically (CONV-7).
_RELEASE = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
)


class RedisClusterState(ClusterState):
    """Redis's cluster state: atomic claims, parked addresses and counters every node shares,
    continued notices published to every node (RATE-7, PARK-9, PARK-20)."""

    shares_parking = True
    shares_limits = True
    shares_resends = True  # COMPAT-10

    def __init__(self, store: RecordBlobs) -> None:
        super().__init__(store)
        assert isinstance(store, RedisStore)
        self.redis = store

    async def _claim(self, key: str, blob: bytes, expires_at: float) -> bytes | None:
        """``SET NX PXAT`` and ``GET`` in one transaction (IDEM-3)."""

        async def op(client: aioredis.Redis) -> bytes | None:
            async with client.pipeline(transaction=True) as pipe:
                pipe.set(KEY_PREFIX + key, blob, nx=True, pxat=int(expires_at * 1000))
                pipe.get(KEY_PREFIX + key)
                claimed, held = await pipe.execute()
            return None if claimed else bytes(held)

        held: bytes | None = await self.redis._call(op)
        return held

    async def _release(self, key: str, blob: bytes) -> bool:
        """One Lua script: ``GET`` compared, then ``DEL`` (CONV-7)."""

        async def op(client: aioredis.Redis) -> bool:
            gone = await cast(Awaitable[int], client.eval(_RELEASE, 1, KEY_PREFIX + key, blob))
            return bool(gone)

        removed: bool = await self.redis._call(op)
        return removed

    async def _publish_continued(self, response_id: str) -> None:
        async def op(client: aioredis.Redis) -> None:
            await client.publish(CONTINUED_CHANNEL, response_id)

        await self.redis._call(op)

    async def _set_parked(self, response_id: str, address: str | None, ttl_s: float) -> None:
        """PARK-20: ``rollout:parked:<id>`` holds the parking node's address, expiring with it."""

        async def op(client: aioredis.Redis) -> None:
            if address is None:
                await client.delete(PARKED_PREFIX + response_id)
            else:
                await client.set(PARKED_PREFIX + response_id, address, px=max(1, int(ttl_s * 1000)))

        await self.redis._call(op)

    async def _get_parked(self, response_id: str) -> str | None:
        async def op(client: aioredis.Redis) -> bytes | None:
            found: bytes | None = await client.get(PARKED_PREFIX + response_id)
            return found

        found: bytes | None = await self.redis._call(op)
        return None if found is None else found.decode(errors="replace")


class RedisStore(ResponseStore):
    kind = "redis"
    cluster_state = RedisClusterState
    reads_prefixes = True  # GETRANGE (STORE-20)

    def __init__(
        self,
        url: str,
        ttl_s: float = DEFAULT_TTL_S,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    ) -> None:
        super().__init__(ttl_s, max_record_bytes)
        self.url = url
        self._client: aioredis.Redis | None = None
        self._lane: _Lane | None = None
        self._listener: asyncio.Task[None] | None = None
        self.lane_writes = 0  # writes acknowledged over the lane (STORE-14)
        self.pooled_writes = 0  # writes through the pooled client (refresh, lane busy or failed)
        self.lane_failures = 0  # lane attempts that failed and fell back to the pool

    async def open(self) -> None:
        """Connects lazily: a Redis that is down at start only makes requests fail (STORE-8)."""
        if self._client is not None:
            return
        self._client = _client(self.url, COMMAND_TIMEOUT_S, POOL_CONNECTIONS)
        self._lane = _Lane(self._client.connection_pool)
        self.cluster.limits = RedisCounters(self._call)  # every node counts in Redis (RATE-7)
        self._listener = asyncio.create_task(self._listen(), name="store-redis-deletes")
        await self.health()

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener
            self._listener = None
        if self._lane is not None:
            await self._lane.close()
            self._lane = None
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    # ------------------------------------------------------------------ primitives
    async def _write(
        self, key: str, blob: bytes, links: Sequence[str], refresh: bool, expires_at: float | None
    ) -> None:
        at_ms = None if expires_at is None else int(expires_at * 1000)
        lane = self._lane
        if not refresh and lane is not None and not lane.busy:  # the usual turn (STORE-14)
            try:
                await lane.set(KEY_PREFIX + key, blob, at_ms)
            except (RedisError, OSError) as exc:  # builtin TimeoutError is an OSError
                self.lane_failures += 1
                log.debug("redis store: lane write failed (%s); retrying pooled", exc)
                await self._retry_pooled(key, blob, at_ms)
            else:
                self.lane_writes += 1
            return
        await self._write_pooled(key, blob, links, refresh, at_ms)

    async def _retry_pooled(self, key: str, blob: bytes, at_ms: int | None) -> None:
        """After a lane failure: the pooled client, bounded so the whole write takes at most two
        command timeouts (as a pooled write and its retry on a fresh connection do)."""
        try:
            async with asyncio.timeout(COMMAND_TIMEOUT_S):
                await self._write_pooled(key, blob, (), False, at_ms)
        except TimeoutError:  # raised only when this bound fires
            raise StoreUnavailable("the Redis store did not answer in time") from None

    async def _write_pooled(
        self, key: str, blob: bytes, links: Sequence[str], refresh: bool, at_ms: int | None
    ) -> None:
        async def op(client: aioredis.Redis) -> None:
            if not refresh:  # one command
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
        self.pooled_writes += 1

    async def _read(self, keys: Sequence[str]) -> list[bytes | None]:
        async def op(client: aioredis.Redis) -> list[bytes | None]:
            blobs: list[bytes | None] = await client.mget([KEY_PREFIX + key for key in keys])
            return blobs

        blobs: list[bytes | None] = await self._call(op)
        return blobs

    async def _read_head(self, key: str) -> bytes | None:
        """``GETRANGE``: the head line only, whatever the record's size (STORE-20, HYD-5)."""

        async def op(client: aioredis.Redis) -> bytes:
            head: bytes = await client.getrange(KEY_PREFIX + key, 0, MAX_HEAD - 1)
            return head

        head: bytes = await self._call(op)
        return head or None  # a missing key reads as empty; no record is

    async def _scan(self, cursor: str, limit: int) -> tuple[list[tuple[str, bytes]], str | None]:
        """``SCAN`` (its cursor, opaque to callers; a key may come twice) then ``GETRANGE``s
        of the head lines in one pipeline."""

        async def op(client: aioredis.Redis) -> tuple[int, list[bytes], list[bytes]]:
            after, keys = await client.scan(int(cursor or 0), match=KEY_PREFIX + "*", count=limit)
            async with client.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.getrange(key, 0, MAX_HEAD - 1)
                heads = await pipe.execute()
            return after, keys, heads

        after, keys, heads = await self._call(op)
        skip = len(KEY_PREFIX)
        page = [(key.decode()[skip:], head) for key, head in zip(keys, heads, strict=True) if head]
        return page, (None if after == 0 else str(after))

    async def _load_salt(self, fresh: bytes) -> bytes:
        async def op(client: aioredis.Redis) -> bytes:
            async with client.pipeline(transaction=True) as pipe:
                pipe.set(SALT_KEY, fresh, nx=True)
                pipe.get(SALT_KEY)
                _, kept = await pipe.execute()
            return bytes(kept)

        salt: bytes = await self._call(op)
        return salt

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
        except (RedisError, OSError) as exc:  # OSError includes the builtin TimeoutError
            raise StoreUnavailable(f"{type(exc).__name__}: {exc}") from None

    # ------------------------------------------------------------------ deletes elsewhere
    async def _listen(self) -> None:
        """Deletes (STORE-11) and continued notices (PARK-9) made by any process reach this
        one's caches and parking lot; resubscribes after outages."""
        while True:
            client = _client(self.url, None)  # a subscriber waits indefinitely for messages
            try:
                async with client.pubsub(ignore_subscribe_messages=True) as pubsub:
                    await pubsub.subscribe(DELETED_CHANNEL, CONTINUED_CHANNEL)
                    async for message in pubsub.listen():
                        self._dispatch(message.get("channel"), message.get("data"))
            except (RedisError, OSError) as exc:
                log.debug("redis store: delete channel lost (%s); resubscribing", exc)
            finally:
                await client.aclose()
            await asyncio.sleep(RESUBSCRIBE_AFTER_S)

    def _dispatch(self, channel: object, data: object) -> None:
        if not isinstance(data, bytes) or len(data) > MAX_NOTICE_BYTES:
            return
        response_id = data.decode(errors="replace")
        if channel == CONTINUED_CHANNEL.encode():
            self.cluster.notify_continued(response_id)
        else:
            self.cluster.notify_deleted(response_id)


def _client(url: str, timeout: float | None, max_connections: int = 1) -> aioredis.Redis:
    """A client on a bounded pool (STORE-16): at most ``max_connections`` sockets; a command
    that finds them all busy waits for one up to the command timeout, then fails as the store
    being unavailable (503 ``store_unavailable``, STORE-8) instead of opening another."""
    pool = BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=COMMAND_TIMEOUT_S,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        socket_timeout=timeout,
        retry=Retry(NoBackoff(), 1),  # once, on a fresh connection: stale sockets after restarts
        health_check_interval=30,
    )
    client: aioredis.Redis = aioredis.Redis.from_pool(pool)
    return client


class _Lane:
    """One dedicated connection for the per-turn ``SET`` while it is free (STORE-14).

    Built from the pool's own settings (host, TLS, auth, db), driven with redis-py's
    ``Connection`` directly: no pool checkout/release, no client retry wrapper, no per-command
    task (``socket_timeout`` on a connection wraps each send in ``asyncio.wait_for``, which
    spawns a task on Python 3.11). Any failure or cancellation disconnects it, so it never holds
    an unread reply; it reconnects on its next use. No idle health-check ``PING``: a stale lane
    fails its write, which the caller retries through the pool (the ``SET`` is idempotent: same
    key, value and absolute expiry).

    The command timeout bounds connect, send and reply together, enforced by a *watchdog*
    rather than an ``asyncio.timeout`` per write: that arms and frees an event-loop timer every
    time, which on a turn after an idle gap costs about as much as a fifth of the round trip.
    The watchdog timer is armed only when none is pending and fires at most once per command
    timeout: it cancels a write still in flight past its deadline (reported as a timeout) and
    otherwise re-arms for the write in flight, or lapses."""

    def __init__(self, pool: ConnectionPool) -> None:
        kwargs = {**pool.connection_kwargs, "socket_timeout": None, "health_check_interval": 0}
        self._conn: AbstractConnection = pool.connection_class(**kwargs)
        self.busy = False
        self._writer: asyncio.Task[Any] | None = None  # the task whose write is in flight
        self._cancels = 0  # its cancel requests pending before the write began
        self._deadline = 0.0
        self._expired = False  # the watchdog cancelled the write in flight
        self._watchdog: asyncio.TimerHandle | None = None

    async def set(self, key: str, blob: bytes, at_ms: int | None) -> None:
        conn, command = self._conn, _set_command(key, blob, at_ms)
        task = self._arm()
        try:
            await conn.send_packed_command(command, check_health=False)
            reply = await conn.read_response()
            if reply not in (b"OK", "OK"):  # bytes, or str with decode_responses
                raise RedisError(f"unexpected reply to SET: {reply!r}")
        except BaseException as exc:  # failure, timeout or cancellation: drop any unread reply
            await self._disconnect()
            if self._timed_out(task, exc):
                raise TimeoutError("the Redis lane did not answer in time") from None
            raise
        finally:
            self._writer, self.busy = None, False

    def _arm(self) -> asyncio.Task[Any]:
        task = asyncio.current_task()
        assert task is not None, "a store write runs in a task"
        loop = asyncio.get_running_loop()
        self.busy, self._expired = True, False
        self._writer, self._cancels = task, task.cancelling()
        self._deadline = loop.time() + COMMAND_TIMEOUT_S
        if self._watchdog is None:
            self._watchdog = loop.call_at(self._deadline, self._watch)
        return task

    def _watch(self) -> None:
        self._watchdog = None
        writer = self._writer
        if writer is None:
            return  # idle: lapse until the next write
        loop = asyncio.get_running_loop()
        if loop.time() >= self._deadline:
            self._expired = True
            writer.cancel()  # thrown into the write's pending await, inside ``set``
        else:
            self._watchdog = loop.call_at(self._deadline, self._watch)

    def _timed_out(self, task: asyncio.Task[Any], exc: BaseException) -> bool:
        """Our watchdog's cancel becomes a timeout, unless the task was cancelled as well."""
        if not self._expired or not isinstance(exc, asyncio.CancelledError):
            return False
        self._expired = False
        return task.uncancel() <= self._cancels

    async def _disconnect(self) -> None:
        with contextlib.suppress(Exception):
            await self._conn.disconnect(nowait=True)

    async def close(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        await self._disconnect()


def _set_command(key: str, blob: bytes, at_ms: int | None) -> list[bytes]:
    """``SET key blob [PXAT at_ms]`` framed in RESP, the blob not copied: a third of the cost of
    redis-py's general ``pack_command`` on a cold turn (its per-argument encoding loop)."""
    name = key.encode()
    head = b"*%d\r\n$3\r\nSET\r\n$%d\r\n%b\r\n$%d\r\n" % (
        3 if at_ms is None else 5,
        len(name),
        name,
        len(blob),
    )
    if at_ms is None:
        return [head, blob, b"\r\n"]
    at = b"%d" % at_ms
    return [head, blob, b"\r\n$4\r\nPXAT\r\n$%d\r\n%b\r\n" % (len(at), at)]
