"""The per-process hydration cache (SPEC: HYD-1..HYD-5).

Recently finished ``store: true`` responses keep their processed context (items, rendered
tokens, tool-call ledger) here, keyed by response id. A continuation that names one of them
from anywhere in this process (an HTTP ``previous_response_id``, a new WebSocket connection, an
older id on a live connection) forks that context and runs pre-inference only over its new
items, instead of hydrating the whole chain from the store and re-processing it.

Bounded in bytes, not entries: a long conversation costs what it holds, measured as the real
bytes its items, ledgers and token buffers occupy (MEM-10), so an image costs its data, not a
token estimate. The least
recently used entries go first. The cache shares the context object with the response's lane
cache, so it costs no copy at publication; whoever moves that context on (the compat fast path)
must ``discard`` the entry first (HYD-3).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass

from engine.conversation.context import Context
from engine.models.base import Backend

# The entry itself (MEM-11): its object, the LRU's link and dict slot, the response id string.
ENTRY_OVERHEAD = 400


@dataclass(slots=True)
class CachedContext:
    """One cached context: what a continuation needs to skip the store and full pre-inference."""

    response_id: str
    ctx: Context
    backend: Backend
    owner: str | None  # the API-key identity that created the response (OWN-1)
    nbytes: int  # the size it was charged at (``Context.retained_bytes`` when published)


class HydrationCache:
    """A bounded LRU of contexts by response id, sized in bytes (HYD-2)."""

    def __init__(self, max_bytes: int, counters: Counter[str]) -> None:
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._entries: OrderedDict[str, CachedContext] = OrderedDict()
        self._counters = counters

    def publish(self, response_id: str, ctx: Context, backend: Backend, owner: str | None) -> None:
        """Remember a finished response's context (no copy: see the module docstring)."""
        size = ctx.retained_bytes + ENTRY_OVERHEAD
        if size > self.max_bytes:
            return  # it would evict everything else and still not fit
        self.discard(response_id)
        self._entries[response_id] = CachedContext(response_id, ctx, backend, owner, size)
        self.nbytes += size
        while self.nbytes > self.max_bytes:
            _, old = self._entries.popitem(last=False)
            self.nbytes -= old.nbytes
            self._counters["hydration.evicted"] += 1

    def get(
        self, response_id: str, owner: str | None, supports: frozenset[str]
    ) -> CachedContext | None:
        """The entry, if cached, created by ``owner`` and readable by a backend that
        ``supports`` these content kinds; counts a hit or a miss (HYD-4).

        An entry of another owner is a miss: the caller then answers not-found (OWN-2). So is a
        context validated for a backend that reads more than the new one: the store path then
        re-validates the history against the new route (COMPAT-4)."""
        entry = self._entries.get(response_id)
        if entry is None or entry.owner != owner or not entry.backend.supports <= supports:
            self._counters["hydration.miss"] += 1
            return None
        self._entries.move_to_end(response_id)
        self._counters["hydration.hit"] += 1
        return entry

    def discard(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is None:
            return False
        self.nbytes -= entry.nbytes
        return True

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, response_id: object) -> bool:
        return response_id in self._entries
