"""The SQLite store's thread: one connection, a bounded FIFO of jobs, group commit, and a
deadline on every job (STORE-10, STORE-18).

* Bounded: at most ``max_queued`` jobs are queued or running; a caller beyond that waits on
  the event loop for a slot, in arrival order (a settling job hands its slot to the oldest
  waiter), so nothing queued is ever overtaken by a later caller.
* A deadline: a caller waits at most ``deadline_s`` (for a slot and for its job together) and
  then gets ``StoreUnavailable`` (503 ``store_unavailable``), so a hung disk or a lock held
  for ever answers instead of hanging every request. A job whose deadline has passed when the
  thread reaches it is not run (a write that timed out is then never committed); one the thread
  had already started runs to its end.
* Every job is accounted until the thread has settled it, not until its caller leaves:
  ``pending_writes`` counts the writes submitted and not yet settled (those waiting for a slot,
  and those whose caller was cancelled or timed out, included), which is what the idle fast
  path checks so that it never overtakes one (STORE-13).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.store.records import StoreUnavailable

log = logging.getLogger("rollout.store.sqlite")

MAX_BATCH = 256  # jobs per transaction
MAX_QUEUED = 1024  # jobs queued or running; callers beyond it wait on the event loop
DEADLINE_S = 10.0  # longest a caller waits for the thread (STORE-18); ?deadline= in the URL
IDLE_EVERY_S = 300.0  # the idle callback (the expiry sweep) runs at most this often

Op = Callable[[sqlite3.Connection], Any]


@dataclass(slots=True)
class Job:
    op: Op
    writes: bool
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    deadline: float  # time.monotonic(): after it, the thread no longer starts the job
    result: Any = None
    error: BaseException | None = field(default=None)


class StoreThread:
    def __init__(
        self,
        connect: Callable[[], sqlite3.Connection],
        idle: Callable[[sqlite3.Connection], None],
        after_batch: Callable[[sqlite3.Connection], None],
        *,
        deadline_s: float = DEADLINE_S,
        max_queued: int = MAX_QUEUED,
        on_event: Callable[[str], None] = lambda name: None,
    ) -> None:
        self.deadline_s = deadline_s
        self.max_queued = max_queued
        self.pending_writes = 0  # submitted and not yet settled (STORE-13 checks it)
        self._connect = connect
        self._idle = idle
        self._after_batch = after_batch
        self._on_event = on_event
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._in_flight = 0  # jobs holding a slot: queued or running
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._open_error: BaseException | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None

    async def start(self) -> None:
        """Opens the connection on the thread; raises what opening it raised."""
        self._thread = threading.Thread(target=self._serve, name="store-sqlite", daemon=True)
        self._thread.start()
        await asyncio.to_thread(self._ready.wait)
        if self._open_error is not None:
            self._thread = None
            raise self._open_error

    async def stop(self) -> None:
        if self._thread is None:
            return
        self._jobs.put(None)  # after every queued job: they all finish first
        await asyncio.to_thread(self._thread.join)
        self._thread = None

    # ------------------------------------------------------------------ the event loop's side
    async def submit(self, op: Op, *, writes: bool) -> Any:
        if self._thread is None:
            raise StoreUnavailable("the SQLite store is not open")
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + self.deadline_s
        self.pending_writes += writes  # from now until settled: nothing inline overtakes it
        job: Job | None = None
        try:
            async with asyncio.timeout(self.deadline_s):
                await self._admit(loop)
                job = Job(op, writes, loop, loop.create_future(), deadline)
                self._jobs.put_nowait(job)
                return await job.future
        except TimeoutError:
            self._on_event("store.deadline_expired")
            log.warning("sqlite store: no answer within %.1f s (STORE-18)", self.deadline_s)
            raise StoreUnavailable(f"no answer within {self.deadline_s:g} s") from None
        finally:
            if job is None:  # never queued: nothing left to settle
                self.pending_writes -= writes

    async def _admit(self, loop: asyncio.AbstractEventLoop) -> None:
        """A slot, in arrival order: a settling job hands its slot to the oldest waiter."""
        if self._in_flight < self.max_queued and not self._waiters:
            self._in_flight += 1
            return
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.cancelled():
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            else:  # handed a slot just as it was cancelled: pass it on
                self._release()
            raise

    def _release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot moves to it
                return
        self._in_flight -= 1

    def _resolve(self, job: Job) -> None:
        """On the loop, once the thread is done with ``job``."""
        self._release()
        self.pending_writes -= job.writes
        if job.future.done():  # the caller was cancelled or timed out; the work is done
            return
        if job.error is not None:
            job.future.set_exception(job.error)
        else:
            job.future.set_result(job.result)

    # ------------------------------------------------------------------ the thread's side
    def _serve(self) -> None:
        try:
            conn = self._connect()
        except BaseException as exc:  # reported by start(); the thread ends
            self._open_error = exc
            self._ready.set()
            return
        self._ready.set()
        last_idle = 0.0
        try:
            while True:
                if time.monotonic() - last_idle > IDLE_EVERY_S:
                    self._idle(conn)
                    last_idle = time.monotonic()
                try:
                    first = self._jobs.get(timeout=IDLE_EVERY_S)
                except queue.Empty:
                    continue
                batch, stop = self._batch(first)
                self._run_batch(conn, batch)
                self._after_batch(conn)
                if stop:
                    break
        finally:
            conn.close()

    def _batch(self, first: Job | None) -> tuple[list[Job], bool]:
        """The first job and whatever queued behind it (group commit); True on the sentinel."""
        if first is None:
            return [], True
        batch = [first]
        while len(batch) < MAX_BATCH:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is None:
                return batch, True
            batch.append(job)
        return batch, False

    def _run_batch(self, conn: sqlite3.Connection, batch: list[Job]) -> None:
        writes = [job for job in batch if job.writes]
        for job in batch:
            if not job.writes:
                _run(conn, job)
        if writes:
            try:
                conn.execute("BEGIN IMMEDIATE")
                for job in writes:
                    conn.execute("SAVEPOINT job")
                    if _run(conn, job):
                        conn.execute("RELEASE job")
                    else:
                        conn.execute("ROLLBACK TO job")
                        conn.execute("RELEASE job")
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                log.warning("sqlite store: commit failed: %s", exc)
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                for job in writes:
                    job.error = job.error or StoreUnavailable(f"commit failed: {exc}")
        for job in batch:
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
                job.loop.call_soon_threadsafe(self._resolve, job)


def _run(conn: sqlite3.Connection, job: Job) -> bool:
    """One job, unless its caller has given up on it; whatever it raises fails that job only,
    never the thread (whose death would leave every later caller waiting)."""
    if time.monotonic() > job.deadline:
        job.error = StoreUnavailable("its deadline passed before the store's thread reached it")
        return False
    try:
        job.result = job.op(conn)
    except sqlite3.Error as exc:
        log.warning("sqlite store: operation failed: %s", exc)
        job.error = StoreUnavailable(str(exc))
        return False
    except Exception as exc:
        log.exception("sqlite store: operation failed")
        job.error = StoreUnavailable(type(exc).__name__)
        return False
    return True
