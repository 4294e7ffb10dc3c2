"""Rollouts that outlive their socket or request (SPEC: PARK-1..PARK-6).

When a WebSocket closes while a standard-mode rollout is suspended on tool calls, the session
hands the rollout's task here instead of retiring it; so does an HTTP create whose ``store:
true`` response ended with its rollout suspended (PARK-4, ``connection/retaining.py``). It
waits, owned by this lot, for ``park_seconds``. A create of the same owner (a new connection,
the chain's next HTTP request) that continues from the rollout's last response claims it,
exactly once, and resumes it on the fast path (COMPAT-2): its session adopts the task again.
Unclaimed, the timer retires it: the coroutine ends by itself and runs its end-of-rollout
accounting once (ROLL-5, POST-1).

The lot is bounded in count and bytes, per owner and per process (PARK-7): parking past a bound
retires the oldest parked rollout (of that owner, or of the process) with a logged reason, so a
client that opens and drops connections cannot hold the process's memory.

Across nodes (PARK-8..PARK-10): when another process continues a parked rollout's response from
the shared store, the store's notice reaches this lot and the rollout is retired at once, so it
never lives on in two places; the id is remembered (a bounded set), so a socket this process
sees close only later does not park it again. A draining server retires everything it parks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Protocol


class Parkable(Protocol):
    """What the lot needs of a rollout (``engine.rollout.coroutine.Rollout``, which imports the
    engine
    that owns this lot: naming it here would be an import cycle)."""

    @property
    def waiting(self) -> bool: ...

    @property
    def retained_bytes(self) -> int: ...

    def retire(self) -> None: ...


class ParkedAddresses(Protocol):
    """Who is told where rollouts are parked (``engine.retained.handover.Handover``, PARK-20)."""

    def parked(self, response_id: str) -> None: ...

    def unparked(self, response_id: str) -> None: ...


log = logging.getLogger("rollout.parking")

# What a parked rollout holds besides its context (MEM-11): the suspended coroutine's frames,
# its task, turn, response stream and lane: an estimate, checked against RSS for HTTP chains
# (tests/server/bounds/test_parked_memory_functional.py).
PARKED_OVERHEAD = 32 * 1024

# Ids continued elsewhere that this lot remembers (PARK-9): enough to cover the sockets that
# close after their rollout's notice; ids longer than the store's notices carry are not kept.
CONTINUED_MEMORY = 4096


@dataclass(frozen=True)
class ParkingBounds:
    """PARK-7: how much the lot may hold, per process and per owner (an API key)."""

    rollouts: int = 1024
    nbytes: int = 1024 * 1024 * 1024
    rollouts_per_owner: int = 64
    nbytes_per_owner: int = 256 * 1024 * 1024


@dataclass(slots=True)
class Parked:
    response_id: str  # the rollout's last response: what a continuation names
    rollout: Parkable  # an engine.rollout.coroutine.Rollout
    task: asyncio.Task[None]
    owner: str | None  # the API-key identity that created it (OWN-1)
    timer: asyncio.TimerHandle
    nbytes: int  # what it was charged at when parked (its context's retained bytes)
    chain: bool = False  # an HTTP chain's (PARK-4): no address registered (PARK-20)


@dataclass(slots=True)
class _Tally:
    rollouts: int = 0
    nbytes: int = 0


class ParkingLot:
    """Owns parked rollout tasks and their expiry timers; one per engine (process)."""

    def __init__(
        self,
        seconds: float,
        counters: Counter[str],
        bounds: ParkingBounds | None = None,
        registry: ParkedAddresses | None = None,
    ) -> None:
        self.seconds = seconds
        self.bounds = bounds if bounds is not None else ParkingBounds()
        self._lots: dict[str, Parked] = {}  # oldest first (insertion order)
        self._total = _Tally()
        self._owners: dict[str | None, _Tally] = {}
        self._ending: set[asyncio.Task[None]] = set()  # retired, finishing their accounting
        self._counters = counters
        self._continued: OrderedDict[str, None] = OrderedDict()  # newest last, bounded
        self._registry = registry
        self.closed = False

    def park(
        self,
        response_id: str,
        rollout: Parkable,
        task: asyncio.Task[None],
        owner: str | None,
        *,
        chain: bool = False,
    ) -> bool:
        """Take the task over; False (nothing taken) when parking is off or shutting down.
        ``chain``: an HTTP chain's ``store: true`` rollout (PARK-4), whose address is not
        registered for other nodes (PARK-20: another node continues it from the store)."""
        if self.closed or self.seconds <= 0 or not rollout.waiting:
            return False
        if response_id in self._continued:  # already continued on another node (PARK-9)
            self._counters["park.continued_elsewhere"] += 1
            return False
        size = rollout.retained_bytes + PARKED_OVERHEAD
        if size > min(self.bounds.nbytes, self.bounds.nbytes_per_owner):
            log.warning("not parking %s: %d bytes is over the lot's bound", response_id, size)
            self._counters["park.refused"] += 1
            return False
        loop = asyncio.get_running_loop()
        timer = loop.call_later(self.seconds, self._expire, response_id)
        self._add(Parked(response_id, rollout, task, owner, timer, size, chain))
        # It may end on its own while parked (the suspended idle limit, LIM-2): forget it then.
        task.add_done_callback(lambda _t: self._forget(response_id, task))
        self._counters["park.parked"] += 1
        if self._registry is not None and not chain:
            self._registry.parked(response_id)  # a node elsewhere may ask for it (PARK-20)
        self._enforce(owner)
        return True

    def _add(self, entry: Parked) -> None:
        self._lots[entry.response_id] = entry
        for tally in (self._total, self._owners.setdefault(entry.owner, _Tally())):
            tally.rollouts += 1
            tally.nbytes += entry.nbytes

    def _take(self, response_id: str) -> Parked | None:
        """Remove an entry and its charge; its timer is cancelled."""
        entry = self._lots.pop(response_id, None)
        if entry is None:
            return None
        entry.timer.cancel()
        if self._registry is not None and not entry.chain:
            self._registry.unparked(response_id)
        owner = self._owners[entry.owner]
        for tally in (self._total, owner):
            tally.rollouts -= 1
            tally.nbytes -= entry.nbytes
        if owner.rollouts == 0:
            del self._owners[entry.owner]
        return entry

    def _enforce(self, owner: str | None) -> None:
        """PARK-7: retire the oldest parked rollouts until both bounds hold again."""
        b = self.bounds
        while (mine := self._owners.get(owner)) is not None and (
            mine.rollouts > b.rollouts_per_owner or mine.nbytes > b.nbytes_per_owner
        ):
            oldest = next(e for e in self._lots.values() if e.owner == owner)
            self._evict(oldest, "its owner's bound")
        while self._total.rollouts > b.rollouts or self._total.nbytes > b.nbytes:
            self._evict(next(iter(self._lots.values())), "the process's bound")

    def _evict(self, entry: Parked, reason: str) -> None:
        log.warning("retiring parked rollout %s: %s was reached", entry.response_id, reason)
        self._counters["park.evicted"] += 1
        self._take(entry.response_id)
        self._retire(entry)

    def claim(self, response_id: str, owner: str | None) -> Parked | None:
        """Hand a parked rollout back to a continuation of its owner (PARK-3, OWN-2).

        Another owner gets nothing, exactly as if nothing were parked under that id."""
        entry = self._lots.get(response_id)
        if entry is None or entry.owner != owner or not entry.rollout.waiting:
            return None
        self._take(response_id)
        self._counters["park.claimed"] += 1
        return entry

    def release(self, entry: Parked) -> None:
        """Retire a claimed rollout its claimant cannot use (its response was deleted meanwhile):
        the lot owns its task again until it has wound down."""
        self._retire(entry)

    def discard(self, response_id: str) -> bool:
        """Retire a parked rollout now (its response was deleted, HYD-5)."""
        entry = self._take(response_id)
        if entry is None:
            return False
        self._retire(entry)
        return True

    def continued_elsewhere(self, response_id: str) -> None:
        """The store's notice (PARK-9): ``response_id`` was continued from the store by some
        process. A rollout parked behind it here would be a second live copy: retire it now,
        and refuse to park it later (a socket whose close this process has not seen yet)."""
        self._continued[response_id] = None
        self._continued.move_to_end(response_id)
        while len(self._continued) > CONTINUED_MEMORY:
            self._continued.popitem(last=False)
        if self.discard(response_id):
            self._counters["park.continued_elsewhere"] += 1

    def drain(self) -> None:
        """A draining server (LIM-13, PARK-10): nothing can resume here any more, so retire
        every parked rollout now and park nothing new; their stored responses continue on
        another node from the store. ``close`` still waits for them to finish."""
        self.closed = True
        retired = sum(self.discard(response_id) for response_id in list(self._lots))
        if retired:
            self._counters["park.drained"] += retired
            log.warning("retired %d parked rollouts: draining", retired)

    def _expire(self, response_id: str) -> None:
        entry = self._take(response_id)
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
            self._take(response_id)

    def __len__(self) -> int:
        return len(self._lots)

    @property
    def nbytes(self) -> int:
        return self._total.nbytes

    async def close(self) -> None:
        """Shutdown: retire everything parked and wait until each has finished."""
        self.closed = True
        for response_id in list(self._lots):
            self.discard(response_id)
        pending = list(self._ending)
        if pending:
            with contextlib.suppress(Exception):
                await asyncio.gather(*pending, return_exceptions=True)
