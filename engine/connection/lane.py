"""A lane: the FIFO of creates for one ``stream_id`` and its cached latest response
(SPEC: WS-5, CACHE-1..CACHE-4).

The lane and its cache entry are plain state shared by the session (which owns the lane's
worker task) and the compatibility layer (which reads and updates the cache); neither of those
modules imports the other for them.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass

from engine.conversation.context import Context
from engine.models.base import Backend
from engine.rollout.coroutine import Rollout
from engine.rollout.turn import Mode
from protocol.response import CreateParams


@dataclass
class CacheEntry:
    """A lane's latest response: what a continuation needs without touching the store."""

    response_id: str
    ctx: Context
    backend: Backend
    rollout: Rollout | None  # set while that rollout is suspended at this response

    def resumable_by(self, backend: Backend, mode: Mode) -> Rollout | None:
        rollout = self.rollout
        if rollout is None or not rollout.waiting or rollout.mode is not Mode.STANDARD:
            return None
        if mode is not Mode.STANDARD or rollout.backend is not backend:
            return None
        return rollout


class Lane:
    """FIFO of creates for one ``stream_id`` (None = the default lane) and its cached latest."""

    def __init__(self, name: str | None, max_queued: int, counters: Counter[str]) -> None:
        self.name = name
        # Each entry keeps its arrival time: queue wait is one of the reported stages (OBS-1).
        self.queue: asyncio.Queue[tuple[CreateParams, float]] = asyncio.Queue(maxsize=max_queued)
        self.latest: CacheEntry | None = None
        self.worker: asyncio.Task[None] | None = None  # started and owned by the session
        self.active = False  # a create is being served right now
        self._counters = counters  # the engine's event counters (cache.evicted)

    def replace(self, entry: CacheEntry) -> None:
        old, self.latest = self.latest, entry
        if old is not None and old.rollout is not None and old.rollout is not entry.rollout:
            old.rollout.retire()

    def evict(self, response_id: str) -> None:
        if self.latest is not None and self.latest.response_id == response_id:
            if self.latest.rollout is not None:
                self.latest.rollout.retire()
            self.latest = None
            self._counters["cache.evicted"] += 1
