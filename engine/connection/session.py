"""Per-connection state: lanes, their queues and caches, live rollouts (SPEC: WS-1..WS-12).

One ``Session`` per WebSocket connection (and a short-lived one per HTTP request). It owns every
task it starts: lane workers and rollout coroutines. ``close()`` ends them all: suspended
rollouts are retired (post-inference runs normally), running ones are cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from engine.connection.compat import run_create
from engine.connection.lane import CacheEntry, Lane, latest_of, open_lane, valid_stream_id
from engine.connection.retaining import park_latest
from engine.connection.targets import Targets
from engine.core import Engine
from engine.models.base import Backend
from engine.retained.ratelimits import Quota
from engine.rollout.coroutine import Rollout
from engine.rollout.turn import ClientGone, Mode, Turn
from protocol.codec import error_event
from protocol.errors import (
    InvalidRequest,
    ProtocolError,
    ServerError,
    TooManyRequests,
    Unavailable,
)
from protocol.events import (
    ClientEvent,
    ResponseAppend,
    ResponseCreate,
    ResponseInject,
    ResponseProcessed,
    ResponseSteer,
    Sink,
)
from protocol.items import InputItem
from protocol.response import CreateParams

log = logging.getLogger("rollout.session")


class Session:
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
        self.targets = Targets(
            self.lanes, self.rollouts, sink, self.submit_create, multi_agent=multi_agent
        )
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

    # ------------------------------------------------------------------ client events
    async def handle(self, event: ClientEvent, nbytes: int = 0) -> None:
        """Dispatch one decoded client event (``nbytes``: its frame's size); request-scoped
        errors become ``error`` events."""
        try:
            if isinstance(event, ResponseCreate):
                self.submit_create(event, nbytes)
            elif isinstance(event, ResponseSteer):
                await self.targets.steer(event)
            elif isinstance(event, ResponseProcessed):
                # Codex reads no answer to it: any frame here would be taken as the start of
                # its next response's stream (WS-15).
                self.engine.counters["ws.response_processed"] += 1
            else:
                await self.targets.append(event)
        except ProtocolError as err:
            await self.send_error(err, self._lane_of(event, err))
        except Exception:
            # A fault of ours must not cost the client its connection (ERR-3): the event gets
            # a generic error, the details go to the log, never to the wire.
            log.exception("client event %s failed", type(event).__name__)
            await self.send_error(ServerError(), None)

    def _lane_of(self, event: ClientEvent, err: ProtocolError) -> str | None:
        """Which lane a request-scoped error is attributed to (EV-3)."""
        if err.code in _CONNECTION_SCOPED:
            return None
        if isinstance(event, ResponseAppend | ResponseInject):
            return self.targets.lane_of(event)
        stream_id = getattr(event, "stream_id", None)
        return stream_id if isinstance(stream_id, str) and valid_stream_id(stream_id) else None

    def submit_create(self, params: CreateParams, nbytes: int = 0) -> None:
        """Queue a create on its lane (WS-5, WS-6): the lane's worker serves it in order."""
        lane = self._lane_for(params)
        if lane.worker is None:
            lane.worker = self.loop.create_task(self._serve(lane), name=f"lane:{lane.name}")
        limit = self.engine.config.max_queued_bytes
        if self.queued_bytes + nbytes > limit:
            raise TooManyRequests(
                "websocket_queue_full",
                f"Too many queued request bytes on this connection (max {limit}).",
                None,
            )
        try:
            lane.queue.put_nowait((params, time.perf_counter(), nbytes))
        except asyncio.QueueFull:
            raise TooManyRequests(
                "websocket_queue_full",
                f"Too many queued requests on this lane (max {lane.queue.maxsize}).",
                None,
            ) from None
        self.queued_bytes += nbytes

    def _lane_for(self, params: CreateParams) -> Lane:
        """Every create's checks before it is queued or served (LIM-11, LIM-13); its lane."""
        if self.draining:
            raise Unavailable("server_shutting_down", "The server is shutting down.", None)
        age, age_limit = self.loop.time() - self.opened_at, self.engine.config.max_connection_age_s
        if age > age_limit:
            self.expired = True
            raise InvalidRequest(
                "websocket_connection_limit_reached",
                f"Responses websocket connection limit reached ({_age(age_limit)}). "
                "Create a new websocket connection to continue.",
                None,
            )
        config = self.engine.config
        return open_lane(
            self.lanes, params.stream_id, config.max_lanes, config.max_queued_creates,
            self.engine.counters,
        )  # fmt: skip

    def cached(self, response_id: str) -> tuple[Lane, CacheEntry] | None:
        """The lane whose cached latest response is ``response_id`` (any lane: forks, CACHE-4)."""
        return latest_of(self.lanes.values(), response_id)

    def forget(self, response_id: str) -> None:
        """Drop a deleted response from this connection's lane caches (STORE-11)."""
        for lane in self.lanes.values():
            lane.evict(response_id)

    async def _serve(self, lane: Lane) -> None:
        """The lane's worker: its creates one at a time, in order (WS-5)."""
        while True:
            params, arrived, nbytes = await lane.queue.get()
            self.queued_bytes -= nbytes
            try:
                if not await self._run_one(lane, params, arrived):
                    return
            finally:
                lane.queue.task_done()

    async def serve_one(self, params: CreateParams) -> None:
        """An HTTP request's one create, in its own task: ``submit_create``'s checks, a lane
        worker's error handling, no worker task or queue between them (HTTP-9)."""
        lane = self._lane_for(params)
        await self._run_one(lane, params, time.perf_counter())

    async def _run_one(self, lane: Lane, params: CreateParams, arrived: float) -> bool:
        """One create on ``lane``, its request-scoped errors sent; False: the client is gone."""
        lane.active = True
        try:
            await run_create(self, lane, params, arrived)
        except ProtocolError as err:
            await self.send_error(err, lane.name)
        except ClientGone:
            return False
        except Exception:
            log.exception("create failed on lane %r", lane.name)
            await self.send_error(ServerError(), lane.name)
        finally:
            lane.active = False
        return True

    async def send_error(self, err: ProtocolError, stream_id: str | None = None) -> None:
        with contextlib.suppress(ClientGone):
            await self.sink.send(error_event(err, stream_id=stream_id))

    @property
    def busy(self) -> bool:
        """A create is queued or a response is being produced (shutdown waits for these)."""
        return any(lane.active or not lane.queue.empty() for lane in self.lanes.values())

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

    async def drain(self) -> None:
        """Wait until every queued create has been served (HTTP uses one create per session)."""
        for lane in list(self.lanes.values()):
            await lane.queue.join()


_CONNECTION_SCOPED = frozenset({"websocket_connection_limit_reached", "invalid_stream_id"})


def _age(seconds: float) -> str:
    return f"{round(seconds / 60)} minutes" if seconds >= 60 else f"{seconds:g} seconds"
