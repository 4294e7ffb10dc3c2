"""WAL checkpoints for the SQLite store, on a thread and connection of their own (STORE-10,
STORE-19).

Left to itself SQLite checkpoints inside the commit that grows the write-ahead log past its
threshold: some turn's durable write would then also copy megabytes into the database and
fsync it. Here a passive checkpoint runs every second beside the writer instead (WAL lets a
checkpoint proceed while the writer commits), and the writer keeps a high automatic threshold
only as a backstop.

A passive checkpoint never restarts the log, and under a steady stream of writes the log may
never be completely checkpointed at the moment a writer begins (the only time SQLite restarts
it); a RESTART checkpoint from this thread would have to win the write lock between two of
the writer's transactions, which under load it rarely does. So the bound is kept by the writer
itself (``bound``): after a transaction that left the log file past ``WAL_LIMIT_BYTES``, the
store's thread runs a RESTART checkpoint (it copies the rest of the log and waits for the
readers, so the next transaction restarts the log from its start) before its next transaction,
under ``lock`` so that it never meets this thread's round. Every connection sets
``journal_size_limit`` to that size, so the restarting commit cuts the file back to it; and the
idle fast path sends a write to a log past the bound to the thread (STORE-13).

After a round that left the log completely checkpointed, the next commit restarts it and
syncs the new log header; this thread makes that commit itself (it rewrites the database
header's unused ``user_version`` with its own value), so the sync happens here, not in a
turn's write (STORE-17). It does so only when the log held something besides its own last
such commit, so an idle store writes nothing.

Failures (an I/O error, a full disk) are logged, at most once a minute, and counted
(``store.checkpoint_failed``, OBS-2); the next round tries again.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

from engine.store.embedded.wal import WalIndex

log = logging.getLogger("rollout.store.sqlite")

EVERY_S = 1.0
WAL_LIMIT_BYTES = 4 * 1024 * 1024  # the log's bound (STORE-19)
BACKSTOP_PAGES = 16_384  # the writer's own wal_autocheckpoint (64 MiB of 4 KiB pages)
TRUNCATE_WAIT_MS = 1000  # how long the last checkpoint, at stop, waits for readers
LOG_EVERY_S = 60.0  # failures are counted every time, logged at most this often


class Checkpointer:
    def __init__(
        self,
        path: Path,
        every_s: float = EVERY_S,
        *,
        synchronous: str = "NORMAL",
        restart_log: bool = False,
        wal_limit_bytes: int = WAL_LIMIT_BYTES,
        on_event: Callable[[str], None] = lambda name: None,
    ) -> None:
        self.path = path
        self.every_s = every_s
        self.synchronous = synchronous
        self.restart_log = restart_log  # restart a checkpointed log here (the inline path's)
        self.wal_limit_bytes = wal_limit_bytes
        self.failures = 0
        self._on_event = on_event
        self._wal = Path(f"{path}-wal")
        self._index: WalIndex | None = None
        self.lock = threading.Lock()  # one checkpoint at a time here: a round, or ``bound``
        self._primed_frames = -1  # the log's length right after this thread restarted it
        self._logged_at = -LOG_EVERY_S
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="store-checkpoint", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        """Checkpointing: writers that never checkpoint themselves rely on it (STORE-13)."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        """The last checkpoint truncates the log: a stopped server leaves one small file."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None

    def _run(self) -> None:
        try:
            conn = self.connect()
        except (sqlite3.Error, OSError) as exc:
            self._failed("no checkpoint connection", exc)
            return
        try:
            while not self._stop.wait(self.every_s):
                self.round(conn)
            self._checkpoint(conn, "TRUNCATE")
        finally:
            conn.close()
            if self._index is not None:
                self._index.close()

    def connect(self) -> sqlite3.Connection:
        """The thread's connection (blocking); tests drive ``round`` on one by hand."""
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            conn.execute(f"PRAGMA synchronous = {self.synchronous}")
            conn.execute(f"PRAGMA journal_size_limit = {self.wal_limit_bytes}")
            conn.execute("PRAGMA wal_autocheckpoint = 0")
            conn.execute("SELECT 1 FROM schema_version LIMIT 0")  # the wal-index is mapped now
            self._index = WalIndex(self.path)
        except (sqlite3.Error, OSError):
            conn.close()
            raise
        return conn

    def round(self, conn: sqlite3.Connection) -> None:
        """One round: a PASSIVE checkpoint; then, if it left the log completely checkpointed,
        the commit that restarts it, here."""
        with self.lock:
            if self._untouched(conn):
                return
            outcome = self._checkpoint(conn, "PASSIVE")
            if outcome is None:
                return
            busy, frames, done = outcome
            if self.restart_log and not busy and frames == done:
                self._restart(conn)

    def bound(self, conn: sqlite3.Connection) -> None:
        """On the store's thread, on its connection, between its transactions (STORE-19): a log
        file past ``wal_limit_bytes`` is checkpointed so that the next transaction restarts it.
        The writer is this very thread, so only a reader or another process can make it wait
        (its busy timeout)."""
        if self._wal_bytes() <= self.wal_limit_bytes:
            return
        with self.lock:
            try:
                busy = conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()[0]
            except sqlite3.Error as exc:
                self._failed("restart checkpoint failed", exc)
                return
        self._on_event("store.wal_restart_busy" if busy else "store.wal_restarted")

    def _untouched(self, conn: sqlite3.Connection) -> bool:
        """Nothing written since this thread restarted the log: checkpointing its own commit
        would only make the next turn's write restart the log again."""
        if self._primed_frames < 0 or self._index is None:
            return False
        frames = self._index.frames()
        return frames is not None and frames <= self._primed_frames

    def _checkpoint(self, conn: sqlite3.Connection, mode: str) -> tuple[int, int, int] | None:
        wait = TRUNCATE_WAIT_MS if mode == "TRUNCATE" else 0
        try:
            conn.execute(f"PRAGMA busy_timeout = {wait}")
            row = conn.execute(f"PRAGMA wal_checkpoint({mode})").fetchone()
        except sqlite3.Error as exc:
            self._failed(f"{mode.lower()} checkpoint failed", exc)
            return None
        busy, frames, done = (int(value) for value in row)
        return busy, frames, done

    def _restart(self, conn: sqlite3.Connection) -> None:
        """Commit one unchanged value: it restarts the log and syncs its header, here. (An
        unchanged row would write nothing; the header's ``user_version``, unused by this
        store, is written whatever its value: one page.)"""
        try:
            conn.execute("BEGIN IMMEDIATE")  # busy_timeout 0: a writer at work restarts it
            (version,) = conn.execute("PRAGMA user_version").fetchone()
            conn.execute(f"PRAGMA user_version = {int(version)}")
            conn.execute("COMMIT")
        except sqlite3.Error:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            return
        frames = self._index.frames() if self._index is not None else None
        self._primed_frames = -1 if frames is None else frames

    def _wal_bytes(self) -> int:
        try:
            return self._wal.stat().st_size
        except OSError:
            return 0

    def _failed(self, what: str, exc: BaseException) -> None:
        self.failures += 1
        self._on_event("store.checkpoint_failed")
        now = time.monotonic()
        if now - self._logged_at >= LOG_EVERY_S:
            self._logged_at = now
            log.warning("sqlite store: %s: %s (%d so far)", what, exc, self.failures)
