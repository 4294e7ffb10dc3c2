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
from engine.connection.ended import Ended, ended_with
from engine.connection.inject import (
    HeldOutputs,
    inject_failed,
    tool_outputs,
    unknown_target,
    waiting_standard,
)
from engine.connection.lane import CacheEntry, Lane, open_lane, valid_stream_id
from engine.connection.retaining import park_latest
from engine.conversation.validation import validate
from engine.core import Engine
from engine.models.base import Backend
from engine.retained.ratelimits import Quota
from engine.rollout.coroutine import Rollout
from engine.rollout.steering import Steer, echo, steer_items, unattached
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
    SteerRef,
)
from protocol.items import InputItem
from protocol.response import CreateParams
from protocol.stream import new_id

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
        # The upgrade opted into OpenAI's multi-agent beta: standard-mode responses take
        # response.inject (INJECT-1).
        self.multi_agent = multi_agent
        self.retains = retains  # an HTTP create's: its chain's suspended rollout (PARK-4)
        self._held = HeldOutputs()  # standard-mode injects waiting for their siblings
        self.lanes: dict[str | None, Lane] = {}
        self._append_targets: dict[str, Rollout] = {}  # live append-mode responses
        self._ended = Ended()  # for precise late-steer and late-append errors
        self.rollouts: dict[asyncio.Task[None], Rollout] = {}
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
                await self.handle_steer(event)
            elif isinstance(event, ResponseProcessed):
                # Codex reads no answer to it: any frame here would be taken as the start of
                # its next response's stream (WS-15).
                self.engine.counters["ws.response_processed"] += 1
            else:
                await self.handle_append(event)
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
            target = self._append_target(event.response_id)
            if target is None and isinstance(event, ResponseInject) and self.multi_agent:
                live = (r for r in self.rollouts.values() if r.steerable(event.response_id))
                target = next(live, None)  # a standard-mode target's lane (INJECT-8)
            return target.turn.stream.stream_id if target is not None else None
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

    def serving(self, response_id: str, append_target: Rollout | None) -> None:
        """A create's response is being produced; an append-mode one takes appends (APPEND-3)."""
        if append_target is not None:
            self._append_targets[response_id] = append_target

    def served(self, response_id: str) -> None:
        """It reached its terminal event: later steers and appends hear so (STEER-7, APPEND-5)."""
        self._ended.add(response_id, append=self._append_targets.pop(response_id, None) is not None)

    def has_finished(self, response_id: str) -> bool:
        """A response of this connection that reached its terminal event (STEER-7)."""
        if self.cached(response_id) is not None:
            return True
        return self._ended.response(response_id, self.rollouts.values())

    def _append_target(self, response_id: str) -> Rollout | None:
        """The live append-mode rollout named: none once its terminal frame is out (APPEND-5)."""
        rollout = self._append_targets.get(response_id)
        return None if rollout is None or ended_with(rollout, response_id) else rollout

    def finished_append(self, response_id: str) -> bool:
        """An append-mode response of this connection that ended (APPEND-5)."""
        return self._ended.append(response_id, self._append_targets.get(response_id))

    def cached(self, response_id: str) -> tuple[Lane, CacheEntry] | None:
        """The lane whose cached latest response is ``response_id`` (any lane: forks, CACHE-4)."""
        for lane in self.lanes.values():
            if lane.latest is not None and lane.latest.response_id == response_id:
                return lane, lane.latest
        return None

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

    async def handle_steer(self, event: ResponseSteer) -> None:
        """Accept, queue or refuse one ``response.steer`` (STEER-1..STEER-7)."""
        target = event.previous_response_id
        rollout = next((r for r in self.rollouts.values() if r.steerable(target)), None)
        if rollout is None:
            await self.sink.send(unattached(event, await _finished(self, target, append=False)))
            return
        stream = rollout.turn.stream
        refused = SteerRef(previous_response_id=target, input=echo(event.input))
        try:
            items = steer_items(event.input)
            validate(rollout.ctx, items, rollout.backend.supports)
        except ProtocolError as err:
            await self.sink.send(stream.steer_failed(refused, "invalid_input", err.message))
            return
        await rollout.steer(Steer(new_id("steer"), items, event.input, target))

    async def handle_append(self, event: ResponseAppend | ResponseInject) -> None:
        """Commit tool outputs into a response that waits for them: an append-mode response
        (APPEND-3..APPEND-6), or with the multi-agent beta a standard-mode one (INJECT-1..9)."""
        rollout = self._append_target(event.response_id)
        if rollout is None:
            if isinstance(event, ResponseInject):  # OpenAI's beta shape for these (INJECT-6)
                await _inject_standard(self, event)
                return
            finished = await _finished(self, event.response_id, append=True)
            raise unknown_target(event.response_id, finished)
        complete = rollout.offer(tool_outputs(event.input))  # raises without any change
        if isinstance(event, ResponseInject):
            await self.sink.send(rollout.turn.stream.inject_created())
        if complete:
            rollout.resume(rollout.turn)

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
        self._append_targets.clear()
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


async def _finished(self: Session, response_id: str, *, append: bool) -> bool:
    """Whether a steer's (or with ``append``, an append's) target is a response of this
    connection that ended, answered once its terminal frame is in the sink: between a terminal
    event built and its frame comes its durable write (STORE-6), and a refusal as already
    completed sent there would reach the client before the response's own end (STEER-7,
    APPEND-5)."""
    for rollout in self.rollouts.values():
        if rollout.turn.stream.id == response_id:
            await rollout.turn.terminal_written()
            break
    return self.finished_append(response_id) if append else self.has_finished(response_id)


async def _inject_standard(self: Session, event: ResponseInject) -> None:
    """A standard-mode target (INJECT-2, INJECT-5): its outputs are held until its calls are
    all answered, then continue it as a create queued on its lane (the fast path)."""
    target = event.response_id
    found = waiting_standard(self.lanes.values(), target) if self.multi_agent else None
    if found is None:
        running = any(r.steerable(target) and not r.waiting for r in self.rollouts.values())
        if running and self.multi_agent:  # it samples: outputs come after its calls (INJECT-7)
            raise _not_waiting()
        finished = self.finished_append(target) or (self.multi_agent and self.has_finished(target))
        await self.sink.send(inject_failed(event, finished))
        return
    continuation = self._held.accept(self.lanes.values(), found, event)
    await self.sink.send(found[2].turn.stream.inject_created())
    if continuation is not None:
        self.submit_create(continuation)


_CONNECTION_SCOPED = frozenset({"websocket_connection_limit_reached", "invalid_stream_id"})


def _not_waiting() -> ProtocolError:
    return InvalidRequest(
        "response_not_waiting", "The response is not waiting for tool outputs.", None
    )


def _age(seconds: float) -> str:
    return f"{round(seconds / 60)} minutes" if seconds >= 60 else f"{seconds:g} seconds"
