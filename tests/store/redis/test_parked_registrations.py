"""PARK-20's failure paths, on a real redis-server: a registration the store refuses is logged
and counted (``park.register_failed``) and nothing else fails; past 256 registrations in flight
the rest are skipped, counted (``park.register_skipped``), and never written."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import redis.asyncio as aioredis

from engine.retained.handover import MAX_PENDING, Handover
from engine.store.redis import RedisStore
from tests.store._procs import RedisServer

ADDRESS = "http://127.0.0.1:9"  # this node's address as its peers would reach it


async def _unreachable(
    url: str, body: bytes, headers: dict[str, str]
) -> tuple[int, str | None, bytes]:
    raise OSError("no hand-over here: only registrations are exercised")


async def _handover(url: str) -> tuple[RedisStore, Handover, Counter[str]]:
    store = RedisStore(url)
    await store.open()
    counters: Counter[str] = Counter()
    handover = Handover(store, counters, seconds=60)
    handover.address, handover.post = ADDRESS, _unreachable
    assert handover.enabled
    return store, handover, counters


async def _parked_keys(admin: aioredis.Redis) -> list[bytes]:
    return sorted([key async for key in admin.scan_iter(match="rollout:parked:*")])


async def test_a_refused_registration_is_counted_and_logged(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """PARK-20: the store refuses the write (``ACL SETUSER default -set``): counted
    ``park.register_failed``, logged, and the next one, once the store takes writes, lands."""
    store, handover, counters = await _handover(redis_server.url)
    admin = aioredis.Redis.from_url(redis_server.url)
    acl: Any = admin.execute_command  # redis-py leaves it untyped
    try:
        await acl("ACL", "SETUSER", "default", "-set")
        handover.parked("resp_refused")
        await handover.close()
        assert counters["park.register_failed"] == 1, counters
        assert "parked rollout's address not kept" in caplog.text
        await acl("ACL", "SETUSER", "default", "+set")
        handover.parked("resp_kept")
        await handover.close()
        assert counters["park.register_failed"] == 1, counters
        assert await _parked_keys(admin) == [b"rollout:parked:resp_kept"]
        assert await store.cluster.parked_at("resp_kept") == ADDRESS
    finally:
        await admin.aclose()
        await store.close()


async def test_registrations_past_the_bound_are_skipped_and_counted(
    redis_server: RedisServer,
) -> None:
    """PARK-20: 256 registrations in flight at most: 260 at once (a burst of closing sockets)
    write 256 addresses and skip 4, counted ``park.register_skipped``."""
    assert MAX_PENDING == 256
    store, handover, counters = await _handover(redis_server.url)
    admin = aioredis.Redis.from_url(redis_server.url)
    try:
        for n in range(260):  # in one go: none of them has run yet
            handover.parked(f"resp_{n:03d}")
        await handover.close()
        assert counters["park.register_skipped"] == 4, counters
        assert counters["park.register_failed"] == 0, counters
        keys = await _parked_keys(admin)
        assert keys == sorted(f"rollout:parked:resp_{n:03d}".encode() for n in range(256))
    finally:
        await admin.aclose()
        await store.close()
