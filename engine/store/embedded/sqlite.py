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
idle (STORE-7). No sync ever runs on the event loop (STORE-17), every caller waits at most the
store's deadline (STORE-18), and the log's size is bounded (STORE-19).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.store.cluster_state import ClusterState, RecordBlobs
from engine.store.embedded.checkpoint import BACKSTOP_PAGES, WAL_LIMIT_BYTES, Checkpointer
from engine.store.embedded.checkpoint import EVERY_S as CHECKPOINT_EVERY_S
from engine.store.embedded.inline import InlineConnection
from engine.store.embedded.thread import DEADLINE_S, MAX_QUEUED, Op, StoreThread
from engine.store.framing import MAX_HEAD
from engine.store.records import (
    DEFAULT_MAX_RECORD_BYTES,
    DEFAULT_TTL_S,
    ResponseStore,
    StoreUnavailable,
)

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
BUSY_TIMEOUT_S = 5.0  # the thread's wait for another process's write lock (at most the deadline)


class SqliteClusterState(ClusterState):
    """SQLite's cluster state: claims atomic across the processes sharing the file (IDEM-3);
    the rest as on a single-process store."""

    def __init__(self, store: RecordBlobs) -> None:
        super().__init__(store)
        assert isinstance(store, SqliteStore)
        self.sqlite = store

    async def _claim(self, key: str, blob: bytes, expires_at: float) -> bytes | None:
        """Read and insert under the write lock (``BEGIN IMMEDIATE``): atomic across processes
        (IDEM-3). An expired row is replaced."""
        now = time.time()

        def op(conn: sqlite3.Connection) -> bytes | None:
            row = conn.execute(
                "SELECT record FROM responses WHERE id = ?"
                " AND (expires_at IS NULL OR expires_at > ?)",
                (key, now),
            ).fetchone()
            if row is not None:
                return bytes(row[0])
            conn.execute(
                "INSERT OR REPLACE INTO responses (id, record, created_at, expires_at)"
                " VALUES (?, ?, ?, ?)",
                (key, blob, now, expires_at),
            )
            return None

        held: bytes | None = await self.sqlite._submit(op, writes=True)
        return held

    async def _release(self, key: str, blob: bytes) -> bool:
        """One ``DELETE`` that matches the holder's value (CONV-7)."""

        def op(conn: sqlite3.Connection) -> bool:
            gone = conn.execute("DELETE FROM responses WHERE id = ? AND record = ?", (key, blob))
            return gone.rowcount > 0

        removed: bool = await self.sqlite._submit(op, writes=True)
        return removed


class SqliteStore(ResponseStore):
    kind = "sqlite"
    cluster_state = SqliteClusterState

    def __init__(
        self,
        path: Path,
        ttl_s: float = DEFAULT_TTL_S,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        synchronous: str = "NORMAL",
        *,
        inline: bool = True,
        deadline_s: float = DEADLINE_S,
        max_queued: int = MAX_QUEUED,
        checkpoint_every_s: float = CHECKPOINT_EVERY_S,
    ) -> None:
        super().__init__(ttl_s, max_record_bytes)
        self.path = path
        self.synchronous = _synchronous(synchronous)  # a bad value is refused before start
        if deadline_s <= 0:
            raise ValueError(f"--store: deadline must be positive seconds, not {deadline_s!r}")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = StoreThread(
            self._connect,
            self._sweep,
            self._bound_wal,
            deadline_s=deadline_s,
            max_queued=max_queued,
            on_event=self.count,
        )
        # Small writes while the thread has none commit on the event loop, where they cannot
        # block (STORE-13); only without an fsync per commit.
        fast = inline and self.synchronous == "NORMAL"
        self._inline = InlineConnection(path) if fast else None
        self._checkpointer = Checkpointer(
            path,
            checkpoint_every_s,
            synchronous=self.synchronous,
            restart_log=fast,
            on_event=self._count_later,
        )

    @property
    def deadline_s(self) -> float:
        return self._thread.deadline_s

    # ------------------------------------------------------------------ lifecycle
    async def open(self) -> None:
        if self._thread.running:
            return
        self._loop = asyncio.get_running_loop()
        try:
            await self._thread.start()
        except (sqlite3.Error, OSError, StoreUnavailable) as exc:
            raise StoreUnavailable(f"cannot open {self.path}: {exc}") from None
        self._checkpointer.start()
        if self._inline is not None:
            try:
                await asyncio.to_thread(self._inline.open)
            except (sqlite3.Error, OSError) as exc:  # the thread serves every write then
                log.warning("sqlite store: no inline writer: %s", exc)
                self._inline = None

    async def close(self) -> None:
        if not self._thread.running:
            return
        await self._thread.stop()
        if self._inline is not None:
            await asyncio.to_thread(self._inline.close)  # closing may checkpoint: off the loop
        await asyncio.to_thread(self._checkpointer.stop)

    def _bound_wal(self, conn: sqlite3.Connection) -> None:
        self._checkpointer.bound(conn)  # after each transaction of the thread's (STORE-19)

    def _count_later(self, event: str) -> None:
        """``count`` from another thread (the checkpointer's)."""
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has gone: nobody scrapes
                self._loop.call_soon_threadsafe(self.count, event)

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
        """The inline connection while no write is pending for the thread (queued, waiting for a
        slot, or abandoned by its caller but not yet settled): nothing to overtake, and the
        write lock is likely free (STORE-13)."""
        return self._inline if self._thread.pending_writes == 0 else None

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

    async def _scan(self, cursor: str, limit: int) -> tuple[list[tuple[str, bytes]], str | None]:
        now = time.time()

        def op(conn: sqlite3.Connection) -> list[tuple[str, bytes]]:
            rows = conn.execute(
                "SELECT id, substr(record, 1, ?) FROM responses WHERE id > ?"
                " AND (expires_at IS NULL OR expires_at > ?) ORDER BY id LIMIT ?",
                (MAX_HEAD, cursor, now, limit + 1),
            ).fetchall()
            return [(row[0], bytes(row[1])) for row in rows]

        rows: list[tuple[str, bytes]] = await self._submit(op, writes=False)
        page = rows[:limit]
        return page, (page[-1][0] if len(rows) > limit else None)

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
        return await self._thread.submit(op, writes=writes)

    # ------------------------------------------------------------------ the thread's side
    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            busy_ms = int(min(BUSY_TIMEOUT_S, self.deadline_s) * 1000)
            conn.execute(f"PRAGMA busy_timeout = {busy_ms}")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                log.warning("sqlite store: WAL mode unavailable on %s (%s)", self.path, mode)
            conn.execute(f"PRAGMA synchronous = {self.synchronous}")
            conn.execute(f"PRAGMA wal_autocheckpoint = {BACKSTOP_PAGES}")  # see Checkpointer
            conn.execute(f"PRAGMA journal_size_limit = {WAL_LIMIT_BYTES}")  # STORE-19
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
