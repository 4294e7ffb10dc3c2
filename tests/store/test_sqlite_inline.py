"""The SQLite store's idle fast path (STORE-13): small writes commit on the event loop when
nothing is queued for the store's thread; anything that could block goes to the thread, and
whichever path a write takes, it is durable when ``put`` returns (STORE-6)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from engine.store import ResponseRecord, chain_record, open_store
from engine.store import sqlite_inline as inline_module
from engine.store.sqlite import SqliteStore
from engine.store.sqlite_inline import MAX_BYTES, InlineConnection
from protocol.items import Message
from protocol.response import Response
from tests.support.wait import wait_for


def _record(n: int, text: str = "hello") -> ResponseRecord:
    response = Response(id=f"resp_{n:04d}", created_at=0, model="sim", status="completed")
    return chain_record(response, [], [Message(role="user", content=text)], None)


def _inline(store: SqliteStore) -> InlineConnection:
    writer = store._inline
    assert writer is not None
    return writer


def _on_disk(path: Path, response_id: str) -> bool:
    """Read by a connection of its own, as another process (or a restart) would."""
    with sqlite3.connect(path) as conn:
        row = conn.execute("SELECT 1 FROM responses WHERE id = ?", (response_id,)).fetchone()
    return row is not None


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    opened = SqliteStore(tmp_path / "s.db")
    await opened.open()
    try:
        yield opened
    finally:
        await opened.close()


async def test_an_idle_store_commits_small_writes_inline(store: SqliteStore) -> None:
    await store.put(_record(1))
    assert _inline(store).commits == 1
    assert _on_disk(store.path, "resp_0001")  # committed before put returned
    assert (await store.get("resp_0001")) is not None


async def test_an_idle_store_probes_liveness_inline(store: SqliteStore) -> None:
    await store.put(_record(20))
    assert await store.exists("resp_0020") and not await store.exists("resp_none")
    assert _inline(store).reads == 2
    await store.delete("resp_0020")
    assert not await store.exists("resp_0020")


async def test_a_large_record_goes_to_the_thread(store: SqliteStore) -> None:
    await store.put(_record(2, "x" * (MAX_BYTES + 1)))
    assert _inline(store).commits == 0
    assert _on_disk(store.path, "resp_0002")
    assert await store.exists("resp_0002")  # read by the thread: never loaded on the loop
    assert _inline(store).reads == 0


async def test_a_held_write_lock_hands_the_write_to_the_thread(store: SqliteStore) -> None:
    """Another writer (another worker process) holds the lock: the inline attempt fails at
    once instead of waiting on the loop, and the thread commits once the lock is free."""
    other = sqlite3.connect(store.path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    put = asyncio.create_task(store.put(_record(3)))
    await wait_for(lambda: store._queued_writes == 1, "the write handed to the thread")
    assert _inline(store).declined == 1  # the inline attempt failed at once: the lock is held
    assert not put.done()  # waiting in the thread (busy_timeout), not on the loop
    other.execute("COMMIT")
    other.close()
    await put
    assert _inline(store).commits == 0
    assert _on_disk(store.path, "resp_0003")


async def test_writes_queued_for_the_thread_are_never_overtaken(store: SqliteStore) -> None:
    other = sqlite3.connect(store.path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    first = asyncio.create_task(store.put(_record(4)))
    await wait_for(lambda: store._queued_writes == 1, "the first write handed to the thread")
    second = asyncio.create_task(store.put(_record(5)))  # one write is queued: no inline try
    await wait_for(lambda: store._queued_writes == 2, "the second write queued behind it")
    assert _inline(store).declined == 1
    other.execute("COMMIT")
    other.close()
    await asyncio.gather(first, second)
    assert _inline(store).commits == 0
    await store.put(_record(6))  # the thread is idle again
    assert _inline(store).commits == 1


async def test_a_failed_inline_write_is_retried_by_the_thread(store: SqliteStore) -> None:
    writer = _inline(store)
    assert writer._conn is not None
    writer._conn.close()  # any failure on the inline connection
    await store.put(_record(7))
    assert writer.declined == 1 and writer.commits == 0
    assert _on_disk(store.path, "resp_0007")
    await store.put(_record(8))  # the broken connection is dropped, the thread serves
    assert writer.commits == 0 and _on_disk(store.path, "resp_0008")


async def test_a_slow_inline_commit_turns_the_fast_path_off(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(inline_module, "STALL_S", 0.0)  # every commit counts as a stall
    await store.put(_record(9))
    await store.put(_record(10))
    assert _inline(store).commits == 1  # the second went to the thread: cooling down
    assert _on_disk(store.path, "resp_0010")


async def test_many_concurrent_writes_all_land(store: SqliteStore) -> None:
    records = [_record(100 + n) for n in range(100)]
    await asyncio.gather(*(store.put(r) for r in records))
    got = await asyncio.gather(*(store.get(r.id) for r in records))
    assert [g.id if g else None for g in got] == [r.id for r in records]


@pytest.mark.parametrize(
    "query", ["?synchronous=full", "?synchronous=extra", "?inline=off", "?inline=0"]
)
async def test_no_inline_writes_with_fsync_or_when_switched_off(tmp_path: Path, query: str) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'f.db'}{query}")
    assert isinstance(store, SqliteStore)
    await store.open()
    try:
        assert store._inline is None
        await store.put(_record(11))
        assert _on_disk(store.path, "resp_0011")
    finally:
        await store.close()


def test_inline_switch_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="inline"):
        open_store(f"sqlite:///{tmp_path / 'f.db'}?inline=maybe")
