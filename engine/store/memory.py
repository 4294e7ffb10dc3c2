"""``memory://``: records in this process only, bounded LRU (STORE-3). For tests and throwaway
runs; nothing survives a restart. Records are kept encoded, as the other backends keep them, so
size limits and decoding behave the same everywhere."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence

from engine.store.framing import MAX_HEAD
from engine.store.records import (
    DEFAULT_MAX_ENTRIES,
    DEFAULT_MAX_RECORD_BYTES,
    DEFAULT_TTL_S,
    ResponseStore,
)


class MemoryStore(ResponseStore):
    kind = "memory"

    def __init__(
        self,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        ttl_s: float = DEFAULT_TTL_S,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    ) -> None:
        super().__init__(ttl_s, max_record_bytes)
        self.max_entries = max_entries
        self._data: OrderedDict[str, tuple[bytes, float | None]] = OrderedDict()

    async def _write(
        self, key: str, blob: bytes, links: Sequence[str], refresh: bool, expires_at: float | None
    ) -> None:
        for link in links:  # a record's links stay as recent (and, refreshed, live as long)
            held = self._data.get(link)
            if held is not None:
                if refresh:
                    self._data[link] = (held[0], _later(held[1], expires_at))
                self._data.move_to_end(link)
        self._data[key] = (blob, expires_at)
        self._data.move_to_end(key)
        while len(self._data) > self.max_entries:
            self._data.popitem(last=False)

    async def _read(self, keys: Sequence[str]) -> list[bytes | None]:
        now = time.time()
        out: list[bytes | None] = []
        for key in keys:
            held = self._data.get(key)
            if held is not None and held[1] is not None and held[1] <= now:
                del self._data[key]
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
            self._data[key] = (blob, held[1])

    async def _remove(self, key: str) -> bool:
        return self._data.pop(key, None) is not None

    async def _ping(self) -> None:
        return None

    def __len__(self) -> int:
        return len(self._data)


def _later(a: float | None, b: float | None) -> float | None:
    if a is None or b is None:
        return None
    return max(a, b)
