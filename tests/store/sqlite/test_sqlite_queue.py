"""The SQLite store's thread and its queue: a deadline on every caller (STORE-18), and no write
ever overtaken by a later one (STORE-13), whatever happened to the caller of the first."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from engine.store import ResponseRecord, StoreUnavailable, chain_record, open_store
from engine.store.embedded.inline import MAX_BYTES
from engine.store.embedded.sqlite import SqliteStore
from protocol.items import Message
from protocol.response import Response

HANG_S = 30.0  # longer than any deadline here: the test releases the hang itself


def _record(n: int, text: str) -> ResponseRecord:
    response = Response(id=f"resp_{n:04d}", created_at=0, model="sim", status="completed")
    return chain_record(response, [], [Message(role="user", content=text)], None)


def _stored_text(path: Path, response_id: str) -> str | None:
    """The record's text as another process would read it."""
    with sqlite3.connect(path) as conn:
        row = conn.execute("SELECT record FROM responses WHERE id = ?", (response_id,)).fetchone()
    if row is None:
        return None
    blob = bytes(row[0])
    return "v2" if b"version two" in blob else "v1" if b"version one" in blob else "?"


@pytest.fixture
async def gate() -> AsyncIterator[threading.Event]:
    """Released at teardown whatever happened, so a hung thread never outlives its test."""
    released = threading.Event()
    yield released
    released.set()


async def _hang(store: SqliteStore, gate: threading.Event, *, writes: bool) -> asyncio.Task[None]:
    """The store's thread stuck in one job (a disk that does not answer), inside the write
    transaction when ``writes``: that holds the write lock too, as a hung commit would."""
    started = threading.Event()

    def stuck(conn: sqlite3.Connection) -> None:
        started.set()
        gate.wait(HANG_S)

    task = asyncio.create_task(store._submit(stuck, writes=writes))
    task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)
    assert await asyncio.to_thread(started.wait, HANG_S)
    return task


async def test_a_hung_thread_answers_store_unavailable_at_the_deadline(
    tmp_path: Path, gate: threading.Event
) -> None:
    store = SqliteStore(tmp_path / "q.db", deadline_s=0.3)
    await store.open()
    try:
        await _hang(store, gate, writes=True)
        puts = [store.put(_record(n, "version one")) for n in range(3)]
        results = await asyncio.wait_for(asyncio.gather(*puts, return_exceptions=True), HANG_S)
        assert all(isinstance(r, StoreUnavailable) for r in results), results
        assert store.counters["store.deadline_expired"] >= 3
        assert not store.available
        gate.set()  # the disk answers again: the writes that timed out are never committed
        await store.put(_record(9, "version one"))  # and service resumes by itself
        assert store.available
        assert [_stored_text(store.path, f"resp_{n:04d}") for n in (0, 1, 2, 9)] == [
            None,
            None,
            None,
            "v1",
        ]
    finally:
        gate.set()
        await store.close()


async def test_callers_waiting_for_a_slot_also_get_the_deadline(
    tmp_path: Path, gate: threading.Event
) -> None:
    store = SqliteStore(tmp_path / "q.db", deadline_s=0.3, max_queued=1, inline=False)
    await store.open()
    try:
        await _hang(store, gate, writes=False)  # the one slot, held by the stuck job
        with pytest.raises(StoreUnavailable):
            await asyncio.wait_for(store.get("resp_0001"), HANG_S)
        gate.set()
        assert await store.get("resp_0001") is None  # the slot came back
    finally:
        gate.set()
        await store.close()


async def test_a_write_whose_caller_was_cancelled_is_not_overtaken(tmp_path: Path) -> None:
    """v1 is queued for the thread (another process holds the write lock), its caller is
    cancelled, the lock is released and v2 of the same response is written at once: v2 must
    not commit first (on the loop) only to be overwritten by v1 a moment later."""
    store = SqliteStore(tmp_path / "q.db")
    await store.open()
    other = sqlite3.connect(store.path, isolation_level=None, check_same_thread=False)
    try:
        other.execute("BEGIN IMMEDIATE")
        first = asyncio.create_task(store.put(_record(1, "version one")))
        await asyncio.sleep(0.1)  # handed to the thread, which waits for the lock
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        other.execute("COMMIT")
        await store.put(_record(1, "version two"))
        await store._submit(lambda conn: None, writes=True)  # behind v1: v1 has landed now
        assert _stored_text(store.path, "resp_0001") == "v2"
    finally:
        other.close()
        await store.close()


async def test_a_write_waiting_for_a_slot_is_not_overtaken(
    tmp_path: Path, gate: threading.Event
) -> None:
    """The queue is full of reads (the thread is stuck on one); v1, too large for the fast
    path, waits for a slot; v2 of the same response, small, comes next: it waits behind v1."""
    store = SqliteStore(tmp_path / "q.db", max_queued=1)
    await store.open()
    try:
        await _hang(store, gate, writes=False)
        big = "version one " + "x" * MAX_BYTES  # over the fast path's limit: the thread's
        first = asyncio.create_task(store.put(_record(1, big)))
        await asyncio.sleep(0.05)
        second = asyncio.create_task(store.put(_record(1, "version two")))
        await asyncio.sleep(0.05)
        assert not second.done(), "the second write went past the first"
        gate.set()
        await asyncio.wait_for(asyncio.gather(first, second), HANG_S)
        assert _stored_text(store.path, "resp_0001") == "v2"
    finally:
        gate.set()
        await store.close()


@pytest.mark.parametrize("query", ["?deadline=0", "?deadline=-1", "?deadline=soon"])
def test_the_deadline_is_checked(tmp_path: Path, query: str) -> None:
    with pytest.raises(ValueError, match="deadline"):
        open_store(f"sqlite:///{tmp_path / 'f.db'}{query}")


def test_the_deadline_is_read_from_the_url(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'f.db'}?deadline=2.5")
    assert isinstance(store, SqliteStore) and store.deadline_s == 2.5
    default = open_store(f"sqlite:///{tmp_path / 'f.db'}")
    assert isinstance(default, SqliteStore) and default.deadline_s == 10.0
