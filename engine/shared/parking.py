"""Rollouts that outlive their socket (SPEC: PARK-1..PARK-6).

When a WebSocket closes while a standard-mode rollout is suspended on tool calls, the session
hands the rollout's task here instead of retiring it. It waits, owned by this lot, for
``park_seconds``. A new connection of the same owner whose ``response.create`` continues from
the rollout's last response claims it and resumes it on the fast path (COMPAT-2): the session
adopts the task again. Unclaimed, the timer retires it: the coroutine ends by itself and runs
its end-of-rollout accounting once (ROLL-5, POST-1).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from dataclasses import dataclass
from typing import Protocol


class Parkable(Protocol):
    """What the lot needs of a rollout (``engine.rollout.coroutine.Rollout``, which imports the
    engine
    that owns this lot: naming it here would be an import cycle)."""

    @property
    def waiting(self) -> bool: ...

    def retire(self) -> None: ...


@dataclass(slots=True)
class Parked:
    response_id: str  # the rollout's last response: what a continuation names
    rollout: Parkable  # an engine.rollout.coroutine.Rollout
    task: asyncio.Task[None]
    owner: str | None  # the API-key identity that created it (OWN-1)
    timer: asyncio.TimerHandle


class ParkingLot:
    """Owns parked rollout tasks and their expiry timers; one per engine (process)."""

    def __init__(self, seconds: float, counters: Counter[str]) -> None:
        self.seconds = seconds
        self._lots: dict[str, Parked] = {}
        self._ending: set[asyncio.Task[None]] = set()  # retired, finishing their accounting
        self._counters = counters
        self.closed = False

    def park(
        self, response_id: str, rollout: Parkable, task: asyncio.Task[None], owner: str | None
    ) -> bool:
        """Take the task over; False (nothing taken) when parking is off or shutting down."""
        if self.closed or self.seconds <= 0 or not rollout.waiting:
            return False
        loop = asyncio.get_running_loop()
        timer = loop.call_later(self.seconds, self._expire, response_id)
        self._lots[response_id] = Parked(response_id, rollout, task, owner, timer)
        # It may end on its own while parked (the suspended idle limit, LIM-2): forget it then.
        task.add_done_callback(lambda _t: self._forget(response_id, task))
        self._counters["park.parked"] += 1
        return True

    def claim(self, response_id: str, owner: str | None) -> Parked | None:
        """Hand a parked rollout back to a continuation of its owner (PARK-3, OWN-2).

        Another owner gets nothing, exactly as if nothing were parked under that id."""
        entry = self._lots.get(response_id)
        if entry is None or entry.owner != owner or not entry.rollout.waiting:
            return None
        del self._lots[response_id]
        entry.timer.cancel()
        self._counters["park.claimed"] += 1
        return entry

    def release(self, entry: Parked) -> None:
        """Retire a claimed rollout its claimant cannot use (its response was deleted meanwhile):
        the lot owns its task again until it has wound down."""
        self._retire(entry)

    def discard(self, response_id: str) -> bool:
        """Retire a parked rollout now (its response was deleted, HYD-5)."""
        entry = self._lots.pop(response_id, None)
        if entry is None:
            return False
        entry.timer.cancel()
        self._retire(entry)
        return True

    def _expire(self, response_id: str) -> None:
        entry = self._lots.pop(response_id, None)
        if entry is not None:
            self._counters["park.expired"] += 1
            self._retire(entry)

    def _retire(self, entry: Parked) -> None:
        entry.rollout.retire()  # the coroutine wakes with nothing, finishes, accounts once
        self._ending.add(entry.task)
        entry.task.add_done_callback(self._ending.discard)

    def _forget(self, response_id: str, task: asyncio.Task[None]) -> None:
        entry = self._lots.get(response_id)
        if entry is not None and entry.task is task:
            del self._lots[response_id]
            entry.timer.cancel()

    def __len__(self) -> int:
        return len(self._lots)

    async def close(self) -> None:
        """Shutdown: retire everything parked and wait until each has finished."""
        self.closed = True
        for response_id in list(self._lots):
            self.discard(response_id)
        pending = list(self._ending)
        if pending:
            with contextlib.suppress(Exception):
                await asyncio.gather(*pending, return_exceptions=True)
