"""What the next commit will do to SQLite's write-ahead log, read from its wal-index (STORE-17).

With ``synchronous=NORMAL`` a WAL commit appends frames and syncs nothing, except the first
commit after the log was fully checkpointed (or emptied): that one *restarts* the log, writes a
new log header at offset 0 and syncs it (SQLite syncs the header so a write reordered by the
disk cannot corrupt the database after a power loss). A connection holding the write lock can
tell which case it is in from the wal-index, the ``-shm`` file every connection to the database
maps: its header's ``mxFrame`` (frames in the log) and its checkpoint record's ``nBackfill``
(frames already copied into the database). The layout is SQLite's documented file format
(https://sqlite.org/walformat.html, section 2.1), shared by every process and version that opens
the file, so it is stable:

* offset 0: ``iVersion`` (u32, 3007000), then at 12 ``isInit`` (u8, 1 once initialised);
* offset 14: ``szPage`` (u16, the page size; 1 means 65536);
* offset 16: ``mxFrame`` (u32), in the first of the header's two copies;
* offset 96: ``nBackfill`` (u32), the first field of the checkpoint record.

Integers are in the host's byte order. While a connection holds the write lock nobody else can
change ``mxFrame`` (only writers append, and only a writer or a RESTART/TRUNCATE checkpoint,
which takes the same lock, resets it); a concurrent passive checkpoint can only raise
``nBackfill``. A transaction that began while ``nBackfill < mxFrame`` reads the log (SQLite
gives it a read mark above 0), and only a transaction on read mark 0 restarts the log: so
``nBackfill < mxFrame`` read under the write lock proves the commit will append.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

WAL_INDEX_VERSION = 3007000
_HEADER = struct.Struct("=I8xBxHI")  # iVersion, (unused, iChange), isInit, (…), szPage, mxFrame
FRAME_HEADER_BYTES = 24
_HEADER_BYTES = 48  # one copy of the header; the second copy follows the first
_BACKFILL = struct.Struct("=I")
_BACKFILL_AT = 96
_READ = _BACKFILL_AT + _BACKFILL.size


class WalIndex:
    """Reads one database's wal-index with ``pread`` (never mapped: a file truncated under a
    mapping would kill the process with SIGBUS). Open it while a connection to the database is
    open (the file exists then and nobody can reset it)."""

    def __init__(self, database: Path) -> None:
        self._fd = os.open(f"{database}-shm", os.O_RDONLY | os.O_CLOEXEC)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def commit_appends(self, limit_bytes: int) -> bool:
        """Under the write lock: True when the next commit appends to a log still under
        ``limit_bytes`` (no restart, so no sync with ``synchronous=NORMAL``); False when it
        would restart the log, the log has passed its bound (the store's thread restarts it,
        STORE-19), or the wal-index is not one this code knows."""
        data = os.pread(self._fd, _READ, 0)
        header = _header(data)
        if header is None:
            return False
        page, frames = header
        (backfilled,) = _BACKFILL.unpack_from(data, _BACKFILL_AT)
        within = frames * (page + FRAME_HEADER_BYTES) < limit_bytes
        return frames > 0 and backfilled < frames and within

    def frames(self) -> int | None:
        """Frames in the log now (None: unknown, e.g. a writer was updating the header). Only
        a hint without the write lock: the log may grow the moment after."""
        data = os.pread(self._fd, _READ, 0)
        if data[:_HEADER_BYTES] != data[_HEADER_BYTES : 2 * _HEADER_BYTES]:
            return None  # the two copies differ while a writer updates them
        header = _header(data)
        return None if header is None else header[1]


def _header(data: bytes) -> tuple[int, int] | None:
    """``(page size, frames)``, or None for a wal-index this code does not know."""
    if len(data) < _READ:
        return None
    version, initialised, page, frames = _HEADER.unpack_from(data, 0)
    if version != WAL_INDEX_VERSION or initialised != 1:
        return None
    return (65536 if page == 1 else int(page)), int(frames)
