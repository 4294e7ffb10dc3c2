"""``memory://``: records in this process only, bounded LRU (STORE-3). For tests and throwaway
runs; nothing survives a restart. Records are kept encoded, as the other backends keep them, so
size limits and decoding behave the same everywhere. The LRU is bounded twice: by a record count
(LIM-5) and by the real bytes the records occupy (MEM-15), whichever binds first."""

from __future__ import annotations

import sys
import time
from collections import OrderedDict
from collections.abc import Sequence

from engine.store.framing import MAX_HEAD
from engine.store.records import (
    DEFAULT_MAX_ENTRIES,
    DEFAULT_MAX_RECORD_BYTES,
    DEFAULT_TTL_S,
    ChainPoint,
    ResponseStore,
)

# What one record costs beyond its key and blob (MEM-15): the OrderedDict's slot and link, the
# (blob, expiry) tuple and the expiry float; measured with tracemalloc at ~146 bytes an entry
# (tests/store/test_memory_bytes.py holds the charge to what the records really allocate).
ENTRY_OVERHEAD = 160
# A quarter of the default --memory-budget (MEM-12's 1 GiB); the engine passes its own share.
DEFAULT_MAX_BYTES = 256 * 1024 * 1024


def charge(key: str, blob: bytes) -> int:
    """The real bytes one record holds in this store (MEM-15)."""
    return sys.getsizeof(key) + sys.getsizeof(blob) + ENTRY_OVERHEAD


class MemoryStore(ResponseStore):
    kind = "memory"

    def __init__(
        self,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        ttl_s: float = DEFAULT_TTL_S,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        super().__init__(ttl_s, max_record_bytes)
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.nbytes = 0  # what the held records are charged (MEM-15)
        self._data: OrderedDict[str, tuple[bytes, float | None]] = OrderedDict()

    @property
    def held_bytes(self) -> int:
        return self.nbytes

    def _put(self, key: str, blob: bytes, expires_at: float | None) -> None:
        held = self._data.get(key)
        if held is not None:
            self.nbytes -= charge(key, held[0])
        self._data[key] = (blob, expires_at)
        self.nbytes += charge(key, blob)

    def _drop(self, key: str) -> bool:
        held = self._data.pop(key, None)
        if held is None:
            return False
        self.nbytes -= charge(key, held[0])
        return True

    async def _write(
        self, key: str, blob: bytes, links: Sequence[str], refresh: bool, expires_at: float | None
    ) -> None:
        for link in links:  # a record's links stay as recent (and, refreshed, live as long)
            held = self._data.get(link)
            if held is not None:
                if refresh:
                    self._data[link] = (held[0], _later(held[1], expires_at))
                self._data.move_to_end(link)
        self._put(key, blob, expires_at)
        self._data.move_to_end(key)
        # Oldest first, past either bound (LIM-5, MEM-15); the record just written stays.
        while len(self._data) > self.max_entries or (
            self.nbytes > self.max_bytes and len(self._data) > 1
        ):
            self._drop(next(iter(self._data)))

    async def _read(self, keys: Sequence[str]) -> list[bytes | None]:
        now = time.time()
        out: list[bytes | None] = []
        for key in keys:
            held = self._data.get(key)
            if held is not None and held[1] is not None and held[1] <= now:
                self._drop(key)
                held = None
            out.append(None if held is None else held[0])
        return out

    async def _scan(self, cursor: str, limit: int) -> tuple[list[tuple[str, bytes]], str | None]:
        # Sorting per page is O(n log n); this backend is for tests and throwaway runs.
        now = time.time()
        live = sorted(
            (key, held[0][:MAX_HEAD])
            for key, held in self._data.items()
            if key > cursor and (held[1] is None or held[1] > now)
        )
        page = live[:limit]
        return page, (page[-1][0] if len(live) > limit else None)

    async def _replace(self, key: str, blob: bytes) -> None:
        held = self._data.get(key)
        if held is not None:
            self._put(key, blob, held[1])

    async def _remove(self, key: str) -> bool:
        return self._drop(key)

    async def _ping(self) -> None:
        return None

    def holds(self, response_id: str) -> bool:
        """Whether a record is still here, unexpired: a dict lookup, no decode. Its deletes
        reach the process's caches at once, its evictions (LIM-5, MEM-15) and expiries do not,
        so a cached context of a stored response asks this before it is served (HYD-5)."""
        held = self._data.get(response_id)
        return held is not None and (held[1] is None or held[1] > time.time())

    def holds_chain(self, point: ChainPoint) -> bool:
        """Whether a chain point's record and every record it links are still here: a record
        written to extend it must read back whole (STORE-2)."""
        return all(self.holds(link) for link in point.links) and self.holds(point.response_id)

    def __len__(self) -> int:
        return len(self._data)


def _later(a: float | None, b: float | None) -> float | None:
    if a is None or b is None:
        return None
    return max(a, b)
