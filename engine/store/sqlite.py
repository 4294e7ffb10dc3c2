"""``sqlite:///PATH``: the embedded, durable store of one process (STORE-10).

SQLite can block, so its work runs off the event loop: one dedicated thread owns the main
connection and serves a bounded queue of jobs. Writes that queue up while a commit is running
are committed together in the next transaction (group commit). The one exception is a small
write, or a read of one small record, while that queue holds no write: it runs on the loop,
on a connection that cannot wait, saving the two thread hand-offs (``sqlite_inline``, STORE-13).
WAL mode lets reads proceed beside the writer. A commit is in the operating system's hands
once it returns, so with the default ``synchronous=NORMAL`` an acknowledged write survives any
crash of the server process (``kill -9`` included) without an fsync per turn;
``?synchronous=full`` also survives an OS crash or power loss, at one fsync per commit
(STORE-6). Expired records are invisible at once and deleted by a sweep the thread runs when
idle (STORE-7).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.store.base import (
    DEFAULT_MAX_RECORD_BYTES,
    DEFAULT_TTL_S,
    ResponseStore,
    StoreUnavailable,
)
from engine.store.sqlite_checkpoint import BACKSTOP_PAGES, Checkpointer
from engine.store.sqlite_inline import InlineConnection

log = logging.getLogger("rollout.store.sqlite")

# Schema migrations, applied in order inside one transaction each; the applied version lives in
# ``schema_version``. Never edit a released step: append a new one.
MIGRATIONS: list[tuple[int, list[str]]] = [
    (
        1,
        [
            "CREATE TABLE responses (id TEXT PRIMARY KEY, record BLOB NOT NULL,"
            " created_at REAL NOT NULL, expires_at REAL)",
            "CREATE INDEX responses_expiry ON responses(expires_at) WHERE expires_at IS NOT NULL",
        ],
    ),
    # The owner digests' salt (OWN-6); a store from before gets one at its first open.
    (2, ["CREATE TABLE meta (key TEXT PRIMARY KEY, value BLOB NOT NULL)"]),
]
SCHEMA_VERSION = MIGRATIONS[-1][0]
SWEEP_EVERY_S = 300.0
MAX_BATCH = 256  # jobs per transaction
MAX_QUEUED = 1024  # jobs waiting for the thread; callers beyond it wait on the event loop

Op = Callable[[sqlite3.Connection], Any]


@dataclass(slots=True)
class _Job:
    op: Op
    writes: bool
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    result: Any = None
    error: BaseException | None = field(default=None)


class SqliteStore(ResponseStore):
    kind = "sqlite"

    def __init__(
        self,
        path: Path,
        ttl_s: float = DEFAULT_TTL_S,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        synchronous: str = "NORMAL",
        *,
        inline: bool = True,
    ) -> None:
        super().__init__(ttl_s, max_record_bytes)
        self.path = path
        self.synchronous = _synchronous(synchronous)  # a bad value is refused before start
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._slots = asyncio.Semaphore(MAX_QUEUED)  # the queue's bound, awaited not blocked
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._open_error: BaseException | None = None
        self._checkpointer = Checkpointer(path)
        # Small writes while the thread has none commit on the event loop, where they cannot
        # block (STORE-13); only without an fsync per commit.
        fast = inline and self.synchronous == "NORMAL"
        self._inline = InlineConnection(path) if fast else None
        self._queued_writes = 0  # writes handed to the thread and not yet settled

    # ------------------------------------------------------------------ lifecycle
    async def open(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._serve, name="store-sqlite", daemon=True)
        self._thread.start()
        await asyncio.to_thread(self._ready.wait)
        if self._open_error is not None:
            self._thread = None
            raise StoreUnavailable(f"cannot open {self.path}: {self._open_error}")
        self._checkpointer.start()
        if self._inline is not None:
            try:
                await asyncio.to_thread(self._inline.open)
            except sqlite3.Error as exc:  # the thread serves every write then
                log.warning("sqlite store: no inline writer: %s", exc)
                self._inline = None

    async def close(self) -> None:
        if self._thread is None:
            return
        self._jobs.put(None)  # after every queued job: they all finish first
        await asyncio.to_thread(self._thread.join)
        self._thread = None
        if self._inline is not None:
            self._inline.close()
        await asyncio.to_thread(self._checkpointer.stop)

    # ------------------------------------------------------------------ primitives
    async def _write(
        self, key: str, blob: bytes, links: Sequence[str], refresh: bool, expires_at: float | None
    ) -> None:
        now = time.time()
        refreshed = tuple(links) if refresh else ()

        def op(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT OR REPLACE INTO responses (id, record, created_at, expires_at)"
                " VALUES (?, ?, ?, ?)",
                (key, blob, now, expires_at),
            )
            if refreshed:
                marks = ",".join("?" * len(refreshed))
                if expires_at is None:
                    sql = f"UPDATE responses SET expires_at = NULL WHERE id IN ({marks})"
                    conn.execute(sql, refreshed)
                else:
                    sql = (
                        "UPDATE responses SET expires_at = max(expires_at, ?)"
                        f" WHERE expires_at IS NOT NULL AND id IN ({marks})"
                    )
                    conn.execute(sql, (expires_at, *refreshed))

        # Inline commits never checkpoint: only while the checkpoint thread does (STORE-13).
        inline = self._idle_inline()
        if inline is not None and self._checkpointer.alive and inline.commit(op, len(blob)):
            return
        await self._submit(op, writes=True)

    def _idle_inline(self) -> InlineConnection | None:
        """The inline connection while no write is queued for the thread: nothing to overtake,
        and the write lock is likely free (STORE-13)."""
        return self._inline if self._queued_writes == 0 else None

    async def _read(self, keys: Sequence[str]) -> list[bytes | None]:
        now = time.time()

        def op(conn: sqlite3.Connection) -> list[bytes | None]:
            marks = ",".join("?" * len(keys))
            rows = conn.execute(
                f"SELECT id, record FROM responses WHERE id IN ({marks})"
                " AND (expires_at IS NULL OR expires_at > ?)",
                (*keys, now),
            ).fetchall()
            found = {row[0]: bytes(row[1]) for row in rows}
            return [found.get(key) for key in keys]

        result: list[bytes | None] = await self._submit(op, writes=False)
        return result

    async def _read_one(self, key: str) -> bytes | None:
        """Read on the loop while no write is queued for the thread (STORE-13)."""
        inline = self._idle_inline()
        if inline is not None:
            done, blob = inline.read(key, time.time())
            if done:
                return blob
        return await super()._read_one(key)

    async def _replace(self, key: str, blob: bytes) -> None:
        def op(conn: sqlite3.Connection) -> None:
            conn.execute("UPDATE responses SET record = ? WHERE id = ?", (blob, key))

        await self._submit(op, writes=True)

    async def _remove(self, key: str) -> bool:
        now = time.time()

        def op(conn: sqlite3.Connection) -> bool:
            live = conn.execute(
                "SELECT 1 FROM responses WHERE id = ? AND (expires_at IS NULL OR expires_at > ?)",
                (key, now),
            ).fetchone()
            conn.execute("DELETE FROM responses WHERE id = ?", (key,))
            return live is not None

        removed: bool = await self._submit(op, writes=True)
        return removed

    async def _load_salt(self, fresh: bytes) -> bytes:
        def op(conn: sqlite3.Connection) -> bytes:
            conn.execute("INSERT OR IGNORE INTO meta VALUES ('owner_salt', ?)", (fresh,))
            row = conn.execute("SELECT value FROM meta WHERE key = 'owner_salt'").fetchone()
            return bytes(row[0])

        salt: bytes = await self._submit(op, writes=True)
        return salt

    async def _ping(self) -> None:
        await self._submit(lambda conn: conn.execute("SELECT 1").fetchone(), writes=False)

    async def _submit(self, op: Op, *, writes: bool) -> Any:
        if self._thread is None:
            raise StoreUnavailable("the SQLite store is not open")
        loop = asyncio.get_running_loop()
        async with self._slots:
            job = _Job(op, writes, loop, loop.create_future())
            self._queued_writes += writes
            try:
                self._jobs.put_nowait(job)
                return await job.future
            finally:
                self._queued_writes -= writes

    # ------------------------------------------------------------------ the thread
    def _serve(self) -> None:
        try:
            conn = self._connect()
        except (sqlite3.Error, OSError, StoreUnavailable) as exc:
            self._open_error = exc
            self._ready.set()
            return
        self._ready.set()
        last_sweep = 0.0
        try:
            while True:
                if time.monotonic() - last_sweep > SWEEP_EVERY_S:
                    self._sweep(conn)
                    last_sweep = time.monotonic()
                try:
                    first = self._jobs.get(timeout=SWEEP_EVERY_S)
                except queue.Empty:
                    continue
                batch, stop = self._batch(first)
                self._run_batch(conn, batch)
                if stop:
                    break
        finally:
            conn.close()

    def _batch(self, first: _Job | None) -> tuple[list[_Job], bool]:
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

    def _run_batch(self, conn: sqlite3.Connection, batch: list[_Job]) -> None:
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
                    job.error = StoreUnavailable(f"commit failed: {exc}")
        for job in batch:
            _settle(job)

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            conn.execute("PRAGMA busy_timeout = 5000")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                log.warning("sqlite store: WAL mode unavailable on %s (%s)", self.path, mode)
            conn.execute(f"PRAGMA synchronous = {self.synchronous}")
            conn.execute(f"PRAGMA wal_autocheckpoint = {BACKSTOP_PAGES}")  # see Checkpointer
            migrate(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _sweep(self, conn: sqlite3.Connection) -> None:
        try:
            gone = conn.execute(
                "DELETE FROM responses WHERE expires_at IS NOT NULL AND expires_at <= ?",
                (time.time(),),
            ).rowcount
        except sqlite3.Error as exc:
            log.warning("sqlite store: sweep failed: %s", exc)
            return
        if gone:
            log.info("sqlite store: %d expired responses removed", gone)


def migrate(conn: sqlite3.Connection) -> int:
    """Bring the schema to ``SCHEMA_VERSION``; refuse a database from a newer server."""
    conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    row = conn.execute("SELECT max(version) FROM schema_version").fetchone()
    current = int(row[0] or 0)
    if current > SCHEMA_VERSION:
        raise StoreUnavailable(
            f"database schema version {current} is newer than this server's {SCHEMA_VERSION}"
        )
    for version, statements in MIGRATIONS:
        if version <= current:
            continue
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Workers of one pool open the file together: another may have migrated while this
            # one waited for the write lock (WORK-1), so check again under the lock.
            row = conn.execute("SELECT max(version) FROM schema_version").fetchone()
            if version > int(row[0] or 0):
                for statement in statements:
                    conn.execute(statement)
                conn.execute("INSERT INTO schema_version (version) VALUES (?)", (version,))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        log.info("sqlite store: schema migrated to version %d", version)
    return SCHEMA_VERSION


def _synchronous(value: str) -> str:
    value = value.upper()
    if value not in ("FULL", "NORMAL", "EXTRA"):
        raise ValueError(f"--store: synchronous must be full, normal or extra, not {value!r}")
    return value


def _run(conn: sqlite3.Connection, job: _Job) -> bool:
    """One job; whatever it raises fails that job only, never the thread (whose death would
    leave every later caller waiting)."""
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


def _settle(job: _Job) -> None:
    with contextlib.suppress(RuntimeError):  # the loop is gone: nobody is waiting any more
        job.loop.call_soon_threadsafe(_resolve, job)


def _resolve(job: _Job) -> None:
    if job.future.done():  # the caller was cancelled; the work is done all the same
        return
    if job.error is not None:
        job.future.set_exception(job.error)
    else:
        job.future.set_result(job.result)
