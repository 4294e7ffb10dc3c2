"""The SQLite store's idle fast path (STORE-13): small writes commit on the event loop when
nothing is queued for the store's thread; anything that could block goes to the thread, and
whichever path a write takes, it is durable when ``put`` returns (STORE-6)."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from engine.store import ResponseRecord, chain_record, open_store
from engine.store.embedded import inline as inline_module
from engine.store.embedded.checkpoint import WAL_LIMIT_BYTES, Checkpointer
from engine.store.embedded.inline import MAX_BYTES, InlineConnection
from engine.store.embedded.sqlite import SqliteStore
from engine.store.embedded.wal import WalIndex
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
    await wait_for(lambda: store._thread.pending_writes == 1, "the write handed to the thread")
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
    await wait_for(
        lambda: store._thread.pending_writes == 1, "the first write handed to the thread"
    )
    second = asyncio.create_task(store.put(_record(5)))  # one write is queued: no inline try
    await wait_for(lambda: store._thread.pending_writes == 2, "the second write queued behind it")
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


def _checkpoint(path: Path, mode: str) -> None:
    """A checkpoint by another connection (another worker process's checkpointer, say)."""
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute(f"PRAGMA wal_checkpoint({mode})").fetchone()


async def test_a_commit_that_would_restart_the_log_goes_to_the_thread(tmp_path: Path) -> None:
    """The first commit after the log was emptied (TRUNCATE) or completely checkpointed
    (PASSIVE) restarts it and syncs its header: never on the loop (STORE-17). The thread's
    commit restarts it; the next small write is inline again."""
    store = SqliteStore(tmp_path / "r.db", checkpoint_every_s=3600)  # checkpoints by hand
    await store.open()
    try:
        writer = _inline(store)
        await store.put(_record(30))
        assert (writer.commits, writer.restarts) == (1, 0)
        for mode, n in (("TRUNCATE", 31), ("PASSIVE", 33)):
            await asyncio.to_thread(_checkpoint, store.path, mode)
            await store.put(_record(n))  # would restart the log: the thread's
            assert writer.restarts == 1 + (n > 31) and _on_disk(store.path, f"resp_{n:04d}")
            await store.put(_record(n + 1))  # the log has frames to append to again
            assert writer.commits == 2 + (n > 31)
    finally:
        await store.close()


async def test_the_checkpointer_restarts_a_checkpointed_log_itself(tmp_path: Path) -> None:
    """After a round that checkpointed the whole log, the checkpoint thread commits once itself
    (that commit restarts the log and syncs its header there), so the turns' next small writes
    stay inline (STORE-17); a round with nothing new to checkpoint writes nothing."""
    store = SqliteStore(tmp_path / "p.db", checkpoint_every_s=3600)  # rounds by hand
    await store.open()
    rounds = Checkpointer(store.path, restart_log=True)
    conn = await asyncio.to_thread(rounds.connect)
    try:
        writer = _inline(store)
        for n in range(40, 44):
            await store.put(_record(n))
            await asyncio.to_thread(rounds.round, conn)
        assert (writer.commits, writer.restarts) == (4, 0)
        frames = _wal_frames(store.path)
        await asyncio.to_thread(rounds.round, conn)  # idle: nothing new
        assert _wal_frames(store.path) == frames
    finally:
        await asyncio.to_thread(conn.close)
        await store.close()


async def test_without_the_restart_the_next_write_would_restart_the_log(tmp_path: Path) -> None:
    """The same rounds without the checkpointer's own commit: the next write is one that
    would restart the log, and goes to the thread (the case the restart saves)."""
    store = SqliteStore(tmp_path / "n.db", checkpoint_every_s=3600)
    await store.open()
    rounds = Checkpointer(store.path, restart_log=False)
    conn = await asyncio.to_thread(rounds.connect)
    try:
        await store.put(_record(50))
        await asyncio.to_thread(rounds.round, conn)
        await store.put(_record(51))
        assert (_inline(store).commits, _inline(store).restarts) == (1, 1)
    finally:
        await asyncio.to_thread(conn.close)
        await store.close()


@pytest.mark.parametrize("record_kib", [8, 256])  # committed inline; by the thread
async def test_the_log_stays_within_its_limit_under_writes(
    tmp_path: Path, record_kib: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """STORE-19: with no checkpoint round at all (and none could win the write lock between
    the writer's transactions under load), the log never passes WAL_LIMIT_BYTES by more than
    one transaction: a small write to a log past it goes to the store's thread, which
    checkpoints and restarts the log after a transaction that took it past, and counts it."""
    monkeypatch.setattr(inline_module, "STALL_S", float("inf"))  # a busy machine's stalls aside
    store = SqliteStore(tmp_path / "w.db", checkpoint_every_s=3600)
    await store.open()
    wal = Path(f"{store.path}-wal")
    record_bytes = record_kib * 1024
    count = 10 * 1024 * 1024 // record_bytes  # 10 MiB of records
    largest = 0
    try:
        for n in range(count):
            await store.put(_record(1000 + n, f"{n}" + "y" * record_bytes))
            largest = max(largest, _size(wal))
        assert largest <= WAL_LIMIT_BYTES + 3 * record_bytes + 64 * 1024
        assert store.counters["store.wal_restarted"] >= 2
        assert all([await store.exists(f"resp_{1000 + n:04d}") for n in (0, count - 1)])
        if record_kib < 64:
            assert _inline(store).commits > count // 2  # most still committed inline
    finally:
        await store.close()


def _size(path: Path) -> int:
    return path.stat().st_size


def _wal_frames(path: Path) -> int | None:
    index = WalIndex(path)
    try:
        return index.frames()
    finally:
        index.close()
