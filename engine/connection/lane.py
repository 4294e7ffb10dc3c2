"""A lane: the FIFO of creates for one ``stream_id`` and its cached latest response
(SPEC: WS-5, CACHE-1..CACHE-4).

The session owns the lane's worker task; the compatibility layer reads the cache. Only the
lane changes its cache, through the methods below: ``latest`` and each entry's ``rollout`` have
one writer.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from engine.conversation.context import Context
from engine.fifo import Fifo
from engine.models.base import Backend
from engine.rollout.coroutine import Rollout
from engine.rollout.turn import Mode
from protocol.errors import InvalidRequest
from protocol.response import CreateParams

_STREAM_ID = re.compile(r"[A-Za-z0-9_.\-]{1,256}")


def valid_stream_id(stream_id: str) -> bool:
    return _STREAM_ID.fullmatch(stream_id) is not None


def open_lane(
    lanes: dict[str | None, Lane],
    stream_id: str | None,
    max_lanes: int,
    max_queued: int,
    counters: Counter[str],
) -> Lane:
    """The connection's lane for ``stream_id``, opened on first use (WS-4)."""
    if stream_id is not None and not valid_stream_id(stream_id):
        raise InvalidRequest(
            "invalid_stream_id",
            "The 'stream_id' field must be a non-empty string with at most 256 characters "
            "and may only contain letters, numbers, underscores, hyphens, and periods.",
            "stream_id",
        )
    lane = lanes.get(stream_id)
    if lane is None:
        named = sum(1 for name in lanes if name is not None)
        if stream_id is not None and named >= max_lanes:
            raise InvalidRequest(
                "websocket_stream_limit_reached",
                "This WebSocket connection has reached its maximum number of distinct stream "
                f"IDs ({max_lanes}). Reuse an existing stream_id or open a new WebSocket "
                "connection.",
                "stream_id",
            )
        lane = lanes[stream_id] = Lane(stream_id, max_queued, counters)
    return lane


def latest_of(lanes: Iterable[Lane], response_id: str) -> tuple[Lane, CacheEntry] | None:
    """The lane whose cached latest response is ``response_id`` (any lane: forks, CACHE-4)."""
    for lane in lanes:
        if lane.latest is not None and lane.latest.response_id == response_id:
            return lane, lane.latest
    return None


@dataclass
class CacheEntry:
    """A lane's latest response: what a continuation needs without touching the store."""

    response_id: str
    ctx: Context
    backend: Backend
    rollout: Rollout | None  # set while that rollout is suspended at this response
    # The create that produced it, without its input: what a standard-mode inject continues it
    # with (INJECT-5). None for an entry no create of this lane produced.
    params: CreateParams | None = None

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
        # Each entry keeps its arrival time (queue wait is a reported stage, OBS-1) and its frame's
        # size in bytes (the connection's queued bytes are bounded, LIM-22).
        self.queue: Fifo[tuple[CreateParams, float, int]] = Fifo(max_queued)
        self._latest: CacheEntry | None = None
        self.worker: asyncio.Task[None] | None = None  # started and owned by the session
        self.active = False  # a create is being served right now
        self._counters = counters  # the engine's event counters (cache.evicted)

    @property
    def latest(self) -> CacheEntry | None:
        """The lane's latest response that ended ``completed`` or ``incomplete`` (CACHE-1)."""
        return self._latest

    def replace(self, entry: CacheEntry) -> None:
        old, self._latest = self._latest, entry
        if old is not None and old.rollout is not None and old.rollout is not entry.rollout:
            old.rollout.retire()

    def evict(self, response_id: str) -> None:
        if self._latest is not None and self._latest.response_id == response_id:
            if self._latest.rollout is not None:
                self._latest.rollout.retire()
            self._latest = None
            self._counters["cache.evicted"] += 1

    def consume(self) -> None:
        """The fast path resumed the latest's rollout (COMPAT-2): its context moves on, so the
        slot stays empty until the new response's terminal event fills it (CACHE-1)."""
        self._latest = None

    def fork_latest(self) -> Context:
        """The cache path on this lane (COMPAT-3): a fork of the latest context; a rollout
        suspended there is retired."""
        entry = self._latest
        assert entry is not None
        ctx = entry.ctx.fork()
        if entry.rollout is not None:
            entry.rollout.retire()
            entry.rollout = None
        return ctx

    def release(self, rollout: Rollout) -> None:
        """The latest's suspended rollout now belongs elsewhere (parked, PARK-1)."""
        if self._latest is not None and self._latest.rollout is rollout:
            self._latest.rollout = None

    def clear(self) -> None:
        """The connection closed (WS-12): its rollouts were already retired or handed over, its
        worker has ended. A cancelled worker's traceback holds this lane: the lane lets go of
        the worker, so neither waits for the cyclic collector (ROLL-9)."""
        self._latest = None
        self.worker = None
