"""EXPORT-2: a store lists the live records an owner may read, a page at a time, on every
backend (real ``redis-server`` and PostgreSQL from tests/store/conftest.py): another owner's,
deleted and expired records are never listed; an operator (``ANY_OWNER``) lists all."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from engine.store import MemoryStore, ResponseStore, chain_record
from engine.store.embedded.sqlite import SqliteStore
from engine.store.framing import ANY_OWNER, OwnerFilter
from engine.store.postgres import PostgresStore
from engine.store.redis import RedisStore
from protocol.items import Message
from protocol.response import Response
from tests.store._procs import RedisServer
from tests.support.wait import wait_for

ALICE, BOB = "a" * 32, "b" * 32


@pytest.fixture(params=["memory", "sqlite", "redis", "postgres"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], ResponseStore]:
    """Sync, as tests/store/test_backends.py's: the real servers are fixtures of their own."""
    if request.param == "memory":
        return MemoryStore
    if request.param == "sqlite":
        return lambda: SqliteStore(tmp_path / "s.db")
    if request.param == "postgres":
        url: str = request.getfixturevalue("postgres_url")
        return lambda: PostgresStore(url)
    redis: RedisServer = request.getfixturevalue("redis_server")
    return lambda: RedisStore(redis.url)


@pytest.fixture
async def store(make_store: Callable[[], ResponseStore]) -> AsyncIterator[ResponseStore]:
    opened = make_store()
    await opened.open()
    try:
        yield opened
    finally:
        await opened.close()


async def put(store: ResponseStore, n: int, owner: str | None) -> str:
    response = Response(id=f"resp_{n:04d}", created_at=0, model="sim", status="completed")
    record = chain_record(response, [], [Message(role="user", content=f"q{n}")], None, owner=owner)
    await store.put(record)
    return record.id


async def listed(store: ResponseStore, owner: OwnerFilter, page: int) -> list[str]:
    ids: list[str] = []
    cursor: str | None = ""
    pages = 0
    while cursor is not None:
        found, cursor = await store.owned_ids(owner, cursor, page)
        assert len(found) <= page or isinstance(store, RedisStore)  # SCAN's COUNT is a hint
        ids += found
        pages += 1
        assert pages < 100, "the cursor does not advance"
    return ids


async def test_an_owner_lists_only_its_own_live_records(store: ResponseStore) -> None:
    alice = [await put(store, n, ALICE) for n in range(0, 14, 2)]
    bob = [await put(store, n, BOB) for n in range(1, 14, 2)]
    open_one = await put(store, 50, None)
    assert await store.delete(alice[0], ALICE)
    for page in (1, 3, 100):
        assert sorted(set(await listed(store, ALICE, page))) == alice[1:]
        assert sorted(set(await listed(store, BOB, page))) == bob
        assert sorted(set(await listed(store, None, page))) == [open_one]
    everyone = await listed(store, ANY_OWNER, 4)
    assert sorted(set(everyone)) == sorted([*alice[1:], *bob, open_one])  # no tombstone


# Redis lists by its SCAN cursor, which may repeat a key (EXPORT-2): not in this property.
@pytest.mark.parametrize("make_store", ["memory", "sqlite", "postgres"], indirect=True)
async def test_sql_and_memory_pages_come_in_id_order_without_repeats(
    store: ResponseStore,
) -> None:
    mine = [await put(store, n, ALICE) for n in range(9)]
    assert await listed(store, ALICE, 2) == mine


async def test_an_expired_record_is_not_listed(store: ResponseStore) -> None:
    """Expiry is set by ``put`` from the store's TTL; a record whose time has passed is gone."""
    await put(store, 1, ALICE)
    store.ttl_s = 0.05  # the next record lives 50 ms
    await put(store, 2, ALICE)

    async def only_the_first() -> bool:
        return await listed(store, ALICE, 10) == ["resp_0001"]

    await wait_for(only_the_first, "the expired record to drop out of the listing")
