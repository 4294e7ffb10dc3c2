"""The idle fast path of the SQLite store's writes and single-record reads (STORE-13).

Handing a write to the store's thread and back costs two thread wake-ups and two GIL hand-offs:
on this kind of machine 150-250 µs of latency for a commit whose own work is 40-70 µs, all of
it on the turn's critical path (the write is acknowledged before the terminal frame, STORE-6).
So when no write is queued for the thread, a small write commits right here, on the caller's
thread, on a connection of its own that can never wait (and a read of one small record, such
as a continuation's "is it still stored?" probe, is served the same way):

* ``busy_timeout = 0``: if anyone else holds the write lock (the store's thread, another worker
  process on the same file) the attempt fails at once and the write goes to the thread;
* no sync, ever (STORE-17): only with ``synchronous=NORMAL`` (WAL), where a commit is an append
  to the log in the operating system's cache (``full``/``extra`` sync every commit: always the
  thread); and a commit that would *restart* the log (the first after a complete checkpoint,
  which syncs the new log header) is given up before it writes anything: under the write lock
  the wal-index says which commit this is (``sqlite_wal``), and that one goes to the thread;
* no checkpoint: ``wal_autocheckpoint = 0``; the checkpoint thread does that work, and this
  connection is closed off the loop (the last connection to close checkpoints);
* bounded size: records up to ``MAX_BYTES``; bigger ones (long chains' snapshots) go to the
  thread;
* a stall guard: one inline operation slower than ``STALL_S`` (a throttled or slow disk) turns
  the fast path off for ``COOLDOWN_S``.

Any failure here is not an answer: the operation is handed to the thread, which decides.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.store.embedded.checkpoint import WAL_LIMIT_BYTES
from engine.store.embedded.wal import WalIndex

log = logging.getLogger("rollout.store.sqlite")

MAX_BYTES = 64 * 1024  # larger records are written and read by the store's thread
STALL_S = 0.002  # an inline operation slower than this ...
COOLDOWN_S = 30.0  # ... sends every operation to the thread for this long

Op = Callable[[sqlite3.Connection], Any]


class InlineConnection:
    """Commits small writes and reads single records on the calling thread when that cannot
    block (see the module)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.commits = 0  # writes committed here
        self.reads = 0  # reads served here
        self.declined = 0  # attempts handed to the thread (busy, failed)
        self.restarts = 0  # writes handed to the thread for the log: a restart, or its bound
        self._conn: sqlite3.Connection | None = None
        self._wal: WalIndex | None = None
        self._broken: list[sqlite3.Connection] = []  # given up; closed off the loop
        self._resume_at = 0.0  # monotonic time the stall guard turns the fast path back on

    def open(self) -> None:
        """Blocking: call it off the event loop (the file exists, the schema is migrated)."""
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            conn.execute("PRAGMA busy_timeout = 0")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA wal_autocheckpoint = 0")
            conn.execute(f"PRAGMA journal_size_limit = {WAL_LIMIT_BYTES}")
            conn.execute("SELECT 1 FROM responses LIMIT 0")  # the wal-index is mapped now
            self._wal = WalIndex(self.path)
        except (sqlite3.Error, OSError):
            conn.close()
            raise
        self._conn = conn

    def close(self) -> None:
        """Blocking (the last connection to a database checkpoints as it closes): call it off
        the event loop."""
        for conn in [*self._broken, *([self._conn] if self._conn is not None else [])]:
            conn.close()
        self._broken.clear()
        self._conn = None
        if self._wal is not None:
            self._wal.close()
            self._wal = None

    def commit(self, op: Op, size: int) -> bool:
        """True once ``op`` is committed here; False when it was not (nothing of it remains)."""
        conn, wal = self._usable(), self._wal
        if conn is None or wal is None or size > MAX_BYTES:
            return False
        done, appended = self._attempt(conn, lambda: _transaction(conn, wal, op))
        if done and not appended:
            self.restarts += 1
        self.commits += done and appended
        return bool(done and appended)

    def read(self, key: str, now: float) -> tuple[bool, bytes | None]:
        """``(True, blob or None)`` when read here; ``(False, None)``: ask the thread."""
        conn = self._usable()
        if conn is None:
            return False, None
        # A record past MAX_BYTES is not even read here (its length is in the row header).
        done, row = self._attempt(
            conn,
            lambda: conn.execute(
                "SELECT CASE WHEN length(record) <= ? THEN record END FROM responses"
                " WHERE id = ? AND (expires_at IS NULL OR expires_at > ?)",
                (MAX_BYTES, key, now),
            ).fetchone(),
        )
        if not done or (row is not None and row[0] is None):  # failed, or large: the thread
            return False, None
        self.reads += 1
        return True, None if row is None else bytes(row[0])

    def _usable(self) -> sqlite3.Connection | None:
        if time.monotonic() < self._resume_at:  # cooling down after a stall
            return None
        return self._conn

    def _attempt(self, conn: sqlite3.Connection, work: Callable[[], Any]) -> tuple[bool, Any]:
        """Timed for the stall guard; any failure is handed back, never raised."""
        start = time.perf_counter()
        try:
            return True, work()
        except Exception as exc:  # the thread runs it again and reports what it finds
            self._abandon(conn, exc)
            return False, None
        finally:
            self._check_stall(time.perf_counter() - start)

    def _abandon(self, conn: sqlite3.Connection, exc: Exception) -> None:
        self.declined += 1
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        except sqlite3.Error:  # in an unknown state: never used again
            self._broken.append(conn)
            self._conn = None
        if getattr(exc, "sqlite_errorcode", None) != sqlite3.SQLITE_BUSY:
            log.warning("sqlite store: inline operation handed to the thread: %s", exc)

    def _check_stall(self, elapsed: float) -> None:
        if elapsed > STALL_S:
            self._resume_at = time.monotonic() + COOLDOWN_S
            log.warning(
                "sqlite store: an inline operation took %.1f ms; all go to the store's thread"
                " for %.0f s",
                elapsed * 1000,
                COOLDOWN_S,
            )


def _transaction(conn: sqlite3.Connection, wal: WalIndex, op: Op) -> bool:
    """Commits ``op`` and returns True, or returns False having written nothing: this commit
    would restart the log and sync its header (STORE-17), or the log is past its bound."""
    conn.execute("BEGIN IMMEDIATE")  # busy_timeout 0: fails at once if the lock is held
    if not wal.commit_appends(WAL_LIMIT_BYTES):
        conn.execute("ROLLBACK")  # nothing written yet: nothing to undo, nothing synced
        return False
    op(conn)
    conn.execute("COMMIT")
    return True
