"""What one client connection has and owns (SPEC: WS-1, WS-12, OWN-1, PARK-1, PARK-4).

One ``Connection`` per WebSocket connection (and a short-lived one per HTTP request): who is
on it (its owner, quota and trace context), its lanes and their caches, the rollout tasks it
owns, what its steers and appends name (``targets.py``), and the ways a create uses them
(``resolve``, ``cached``, ``spawn``, ``adopt``, ``retain``: ``compat.py`` takes a
``Connection``). ``close()`` ends everything it owns: suspended rollouts are retired
(post-inference runs normally) or parked, running ones are cancelled. ``session.Session``
serves the client's events and creates on it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from engine.connection.lane import CacheEntry, Lane, latest_of
from engine.connection.retaining import park_latest
from engine.connection.targets import Targets
from engine.core import Engine
from engine.models.base import Backend
from engine.retained.ratelimits import Quota
from engine.rollout.coroutine import Rollout
from engine.rollout.turn import Mode, Turn
from protocol.events import Sink
from protocol.items import InputItem

log = logging.getLogger("rollout.session")


class Connection:
    def __init__(
        self,
        engine: Engine,
        sink: Sink,
        *,
        transport: str = "ws",
        default_mode: Mode = Mode.STANDARD,
        owner: str | None = None,
        quota: Quota | None = None,
        multi_agent: bool = False,
        retains: bool = False,
    ) -> None:
        self.engine = engine
        self.owner = owner  # the API-key identity of this connection or request (OWN-1)
        self.quota = quota  # its key's rate limits, checked as each create is admitted (RATE-4)
        self.traceparent: str | None = None  # the client's W3C trace context (OTEL-2)
        self.sink = sink
        self.transport = transport
        self.default_mode = default_mode
        self.retains = retains  # an HTTP create's: its chain's suspended rollout (PARK-4)
        self.lanes: dict[str | None, Lane] = {}
        self.rollouts: dict[asyncio.Task[None], Rollout] = {}
        # What a steer, append or inject names (STEER-*, APPEND-*, INJECT-*).
        self.targets = Targets(self.lanes, self.rollouts, sink, multi_agent=multi_agent)
        self.queued_bytes = 0  # frames of creates waiting in this connection's lanes (LIM-22)
        self._backends: dict[str, Backend] = {}  # model name -> backend, resolved once here
        self.loop = asyncio.get_running_loop()
        self.opened_at = self.loop.time()
        self.closed = False
        self.draining = False  # server shutdown began: no new creates (LIM-13)
        self.expired = False  # connection age limit reached: close after the error (LIM-11)
        # Told when a create is admitted and prepared, before it samples (background, BG-2).
        self.on_admitted: Callable[[Turn, list[InputItem]], Awaitable[None]] | None = None

    # ------------------------------------------------------------------ routing (once per model)
    def resolve(self, model: str) -> Backend:
        backend = self._backends.get(model)
        if backend is None:
            backend = self._backends[model] = self.engine.router.resolve(model)
        return backend

    def cached(self, response_id: str) -> tuple[Lane, CacheEntry] | None:
        """The lane whose cached latest response is ``response_id`` (any lane: forks, CACHE-4)."""
        return latest_of(self.lanes.values(), response_id)

    def forget(self, response_id: str) -> None:
        """Drop a deleted response from this connection's lane caches (STORE-11)."""
        for lane in self.lanes.values():
            lane.evict(response_id)

    # ------------------------------------------------------------------ tasks
    def spawn(self, rollout: Rollout) -> None:
        task = asyncio.create_task(rollout.run(), name=rollout.id)
        self.rollouts[task] = rollout
        task.add_done_callback(self._reap)

    def adopt(self, task: asyncio.Task[None], rollout: Rollout) -> None:
        """Take over a running rollout's task (a parked rollout resumed here, PARK-3)."""
        self.rollouts[task] = rollout
        task.add_done_callback(self._reap)

    def _reap(self, task: asyncio.Task[None]) -> None:
        self.rollouts.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            log.error("rollout task failed", exc_info=task.exception())

    async def close(self) -> None:
        """End everything this connection owns; nothing is left running (WS-12)."""
        if self.closed:
            return
        self.closed = True
        workers = [lane.worker for lane in self.lanes.values() if lane.worker is not None]
        for worker in workers:
            worker.cancel()
        parked = self._park_suspended()
        for task, rollout in list(self.rollouts.items()):
            if task in parked:
                del self.rollouts[task]  # the parking lot owns it now (PARK-1)
            elif rollout.waiting:
                rollout.retire()
            else:
                task.cancel()
        pending = workers + list(self.rollouts)
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        self.targets.clear()
        for lane in self.lanes.values():
            lane.clear()

    def _park_suspended(self) -> set[asyncio.Task[None]]:
        """A closing WebSocket parks each standard-mode rollout suspended at its lane's latest
        response instead of retiring it (PARK-1). Returns the tasks handed over."""
        if self.transport != "ws" or self.draining:
            return set()
        engine, owner, reap = self.engine, self.owner, self._reap
        parked = [
            park_latest(engine, owner, lane, self.rollouts, reap) for lane in self.lanes.values()
        ]
        return {task for task in parked if task is not None}

    def retain(self, lane: Lane) -> None:
        """An HTTP create's response ended: a ``store: true`` chain's rollout suspended there
        is parked now, before the request ends, for the chain's next create (PARK-4)."""
        if self.retains and not self.draining:
            task = park_latest(self.engine, self.owner, lane, self.rollouts, self._reap, chain=True)
            if task is not None:
                del self.rollouts[task]  # the parking lot owns it now
