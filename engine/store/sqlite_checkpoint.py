"""WAL checkpoints for the SQLite store, on a thread and connection of their own (STORE-10).

Left to itself SQLite checkpoints inside the commit that grows the write-ahead log past its
threshold: some turn's durable write would then also copy megabytes into the database and
fsync it. Here a passive checkpoint runs every second beside the writer instead (WAL lets a
checkpoint proceed while the writer commits), and the writer keeps a high automatic threshold
only as a backstop.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
from pathlib import Path

log = logging.getLogger("rollout.store.sqlite")

EVERY_S = 1.0
BACKSTOP_PAGES = 16_384  # the writer's own wal_autocheckpoint (64 MiB of 4 KiB pages)


class Checkpointer:
    def __init__(self, path: Path, every_s: float = EVERY_S) -> None:
        self.path = path
        self.every_s = every_s
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
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            log.warning("sqlite store: no checkpoint connection: %s", exc)
            return
        try:
            while not self._stop.wait(self.every_s):
                _checkpoint(conn, "PASSIVE")
            _checkpoint(conn, "TRUNCATE")
        finally:
            conn.close()


def _checkpoint(conn: sqlite3.Connection, mode: str) -> None:
    with contextlib.suppress(sqlite3.Error):  # busy or failing: the next round, or the backstop
        conn.execute(f"PRAGMA wal_checkpoint({mode})").fetchone()
