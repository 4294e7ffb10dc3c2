"""Serving one connection's client events and creates (SPEC: WS-1..WS-12, LIM-11, LIM-13,
LIM-22, HTTP-9).

One ``Session`` per WebSocket connection (and a short-lived one per HTTP request), over its
``Connection`` (``connection.py``: what it has and owns, and ``close()``). Creates queue on their
lane and a worker per lane serves them in order; steers, appends and injects go to its targets.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from engine.connection.compat import run_create
from engine.connection.connection import Connection
from engine.connection.lane import Lane, open_lane, valid_stream_id
from engine.rollout.turn import ClientGone
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
)
from protocol.response import CreateParams

log = logging.getLogger("rollout.session")


class Session(Connection):
    """Serves the client's events and creates on its ``Connection``: each create queued on
    its lane and served there in order by the lane's worker (WS-5, WS-6), steers, appends and
    injects handed to its targets, request-scoped errors sent on the lane they belong to."""

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
                continuation = await self.targets.append(event)
                if continuation is not None:  # an inject's held outputs are complete (INJECT-5)
                    self.submit_create(continuation)
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

    async def drain(self) -> None:
        """Wait until every queued create has been served (HTTP uses one create per session)."""
        for lane in list(self.lanes.values()):
            await lane.queue.join()


_CONNECTION_SCOPED = frozenset({"websocket_connection_limit_reached", "invalid_stream_id"})


def _age(seconds: float) -> str:
    return f"{round(seconds / 60)} minutes" if seconds >= 60 else f"{seconds:g} seconds"
