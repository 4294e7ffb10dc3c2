"""The Redis store's write lane (STORE-14) against a real ``redis-server``: idle writes take the
lane, concurrent ones spill to the pool and all land, a lane whose connection dies or hangs
falls back or fails cleanly and recovers, and a cancelled write leaves no reply behind."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Awaitable
from typing import cast

import pytest
import redis.asyncio as aioredis
from redis.asyncio.connection import Connection

import engine.store.redis as redis_store
from engine.store import ResponseRecord, StoreUnavailable, chain_record
from engine.store.redis import KEY_PREFIX, RedisStore, _set_command
from protocol.items import Message
from protocol.response import Response
from tests.store._procs import RedisServer
from tests.support.wait import wait_for


@pytest.fixture
async def store(redis_server: RedisServer) -> AsyncIterator[RedisStore]:
    opened = RedisStore(redis_server.url)
    await opened.open()
    try:
        yield opened
    finally:
        await opened.close()


def _record(n: int, parent: ResponseRecord | None = None) -> ResponseRecord:
    """Turn ``n`` of a chain (a snapshot when ``parent`` is None): one new item of its own."""
    item = Message(role="user", content=f"turn {n}: " + "x" * 2000)
    response = Response(id=f"resp_lane_{n:04d}", created_at=n, model="sim", status="completed")
    if parent is None:
        return chain_record(response, [item], [item], None)
    context = [Message(role="user", content="earlier")] * parent.length + [item]  # past: unread
    return chain_record(response, [item], context, parent.point)


async def _assert_stored(store: RedisStore, record: ResponseRecord) -> None:
    got = await store.get(record.id)
    assert got is not None and got.response == record.response
    assert got.context == record.context and got.input_items == record.input_items


def _signal(server: RedisServer, signum: signal.Signals) -> None:
    assert server.proc is not None
    server.proc.send_signal(signum)


async def test_idle_turns_take_the_lane_and_refreshes_the_pool(store: RedisStore) -> None:
    parent = None
    for n in range(5):  # a chain written turn by turn, each write idle
        record = _record(n, parent)
        await store.put(record)
        parent = record
    assert (store.lane_writes, store.pooled_writes, store.lane_failures) == (5, 0, 0)
    assert parent is not None
    hydrated = await store.hydrate(parent.id)
    assert hydrated is not None
    assert [item.content for item in hydrated.items] == [
        f"turn {n}: " + "x" * 2000 for n in range(5)
    ]

    stale = _record(5, parent)
    stale.links_expire_at = None  # its links may expire first: a MULTI that extends them
    await store.put(stale)
    assert (store.lane_writes, store.pooled_writes) == (5, 1)
    await _assert_stored(store, stale)


def test_lane_framing_is_redis_pys() -> None:
    packer = Connection()
    blob = b'{"id":"resp_x"}' * 700  # past redis-py's 6,000-byte chunking cutoff
    for at_ms in (None, 1_764_533_000_123):
        extra = () if at_ms is None else ("PXAT", at_ms)
        expected = b"".join(packer.pack_command("SET", "rollout:response:resp_x", blob, *extra))
        assert b"".join(_set_command("rollout:response:resp_x", blob, at_ms)) == expected


async def test_lane_write_without_expiry(redis_server: RedisServer) -> None:
    store = RedisStore(redis_server.url, ttl_s=0)  # keep forever: SET without PXAT
    await store.open()
    admin = aioredis.Redis.from_url(redis_server.url)
    try:
        record = _record(0)
        await store.put(record)
        assert store.lane_writes == 1
        await _assert_stored(store, record)
        assert await admin.pttl(KEY_PREFIX + record.id) == -1  # no expiry
        timed = RedisStore(redis_server.url)  # the default TTL: SET … PXAT
        await timed.open()
        try:
            second = _record(1)
            await timed.put(second)
            assert timed.lane_writes == 1 and await admin.pttl(KEY_PREFIX + second.id) > 0
        finally:
            await timed.close()
    finally:
        await admin.aclose()
        await store.close()


async def test_concurrent_writes_spill_to_the_pool_and_all_land(store: RedisStore) -> None:
    records = [_record(n) for n in range(50)]
    await asyncio.gather(*(store.put(record) for record in records))
    assert store.lane_writes + store.pooled_writes == 50
    assert store.lane_writes >= 1 and store.pooled_writes >= 1  # the lane was busy for some
    for record in records:
        await _assert_stored(store, record)


async def test_the_pool_is_bounded(store: RedisStore, redis_server: RedisServer) -> None:
    """STORE-16: 300 writes at once share at most ``POOL_CONNECTIONS`` pooled sockets (plus the
    lane and the delete subscriber); every write lands."""
    watcher = aioredis.Redis.from_url(redis_server.url)
    records = [_record(n) for n in range(300)]
    peak = 0

    async def sample() -> None:
        nonlocal peak
        while True:
            info = await watcher.info("clients")
            peak = max(peak, int(info["connected_clients"]))
            await asyncio.sleep(0)

    sampler = asyncio.create_task(sample())
    try:
        await asyncio.gather(*(store.put(record) for record in records))
    finally:
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)
        await watcher.aclose()
    assert 0 < peak <= redis_store.POOL_CONNECTIONS + 3  # + lane, subscriber, the watcher
    pool = store._client.connection_pool if store._client is not None else None
    assert pool is not None and pool.max_connections == redis_store.POOL_CONNECTIONS
    for record in records[::50]:
        await _assert_stored(store, record)


async def test_killed_lane_connection_falls_back_then_reconnects(
    store: RedisStore, redis_server: RedisServer
) -> None:
    await store.put(_record(0))
    assert store.lane_writes == 1
    admin = aioredis.Redis.from_url(redis_server.url)
    try:
        killed = await cast(Awaitable[int], admin.client_kill_filter(_type="normal"))
        assert killed >= 1  # the lane and the pooled connection (not this one)
    finally:
        await admin.aclose()

    second = _record(1)
    await store.put(second)  # the lane's socket is dead: retried through the pool
    assert (store.lane_failures, store.pooled_writes, store.lane_writes) == (1, 1, 1)
    third = _record(2)
    await store.put(third)  # the lane reconnected
    assert (store.lane_failures, store.lane_writes) == (1, 2)
    for record in (second, third):
        await _assert_stored(store, record)


async def test_redis_restart_under_the_lane(store: RedisStore, redis_server: RedisServer) -> None:
    first = _record(0)
    await store.put(first)
    await redis_server.kill()
    with pytest.raises(StoreUnavailable):
        await store.put(_record(1))
    assert not store.available
    await redis_server.start()  # appendfsync always: the acknowledged write survived
    second = _record(2)
    await store.put(second)
    assert store.available and store.lane_writes == 2  # the lane itself reconnected
    for record in (first, second):
        await _assert_stored(store, record)


async def test_hung_redis_times_out_as_unavailable(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_store, "COMMAND_TIMEOUT_S", 0.3)  # before open: pool and lane
    store = RedisStore(redis_server.url)
    await store.open()
    try:
        await store.put(_record(0))
        _signal(redis_server, signal.SIGSTOP)  # accepts bytes, never answers
        try:
            with pytest.raises(StoreUnavailable):
                await store.put(_record(1))
            assert store.lane_failures == 1
        finally:
            _signal(redis_server, signal.SIGCONT)
        after = _record(2)
        await store.put(after)
        assert store.available and store.lane_writes == 2
        await _assert_stored(store, after)
    finally:
        await store.close()


async def test_watchdog_rearms_for_the_write_in_flight(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The timer armed by one write fires while a later write waits: that write keeps its own
    deadline (the timer re-arms), so it completes once Redis answers again."""
    monkeypatch.setattr(redis_store, "COMMAND_TIMEOUT_S", 1.0)
    store = RedisStore(redis_server.url)
    await store.open()
    try:
        await store.put(_record(0))  # arms the watchdog for one command timeout from now
        await asyncio.sleep(0.8)
        _signal(redis_server, signal.SIGSTOP)
        try:
            later = asyncio.create_task(store.put(_record(1)))  # its deadline: 1.8 s
            await asyncio.sleep(0.4)  # past the first write's deadline
        finally:
            _signal(redis_server, signal.SIGCONT)
        await later
        assert (store.lane_writes, store.lane_failures) == (2, 0)
    finally:
        await store.close()


async def test_cancelled_write_leaves_the_lane_clean(
    store: RedisStore, redis_server: RedisServer
) -> None:
    await store.put(_record(0))
    lane = store._lane
    assert lane is not None and lane._conn.is_connected
    _signal(redis_server, signal.SIGSTOP)  # the reply to the next SET cannot arrive
    try:
        pending = asyncio.create_task(store.put(_record(1)))
        await wait_for(lambda: lane.busy, "the SET sent, its reply awaited")
        pending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await pending
        assert not lane.busy and not lane._conn.is_connected  # no unread reply can remain
    finally:
        _signal(redis_server, signal.SIGCONT)
    after = _record(2)
    await store.put(after)
    assert store.lane_writes == 2 and store.lane_failures == 0
    await _assert_stored(store, after)
