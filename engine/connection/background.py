"""Background responses: an HTTP create that runs detached from its request (SPEC: BG-1..BG-9).

A background run is a one-create HTTP session driven by a task that ``BackgroundRuns`` owns, so
shutdown can wait for it and then cancel it (LIM-13). Its events go to an ``EventLog``: a bounded
per-response buffer of SSE frames that any number of readers replay from a sequence number and
then follow (``GET /v1/responses/{id}?stream=true&starting_after=N``). The rollout never waits
for a reader: a reader that falls out of the window is disconnected and can resume (BG-5).

The store sees a background response twice: an ``in_progress`` record when it is admitted (so a
poll finds it, in any process sharing the store) and its terminal record. A stored record left
``queued``/``in_progress`` by a process that is gone is settled as ``failed`` when it is read
(BG-8).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

import msgspec

from engine.connection.session import Session
from engine.conversation.footprint import LIST_SLOT
from engine.core import Engine
from engine.retained.leases import RUN_LEASE_S
from engine.retained.ratelimits import Quota
from engine.store import ResponseRecord, StoreError, chain_record, listing_form
from engine.store.failures import wire_error
from protocol.errors import InvalidRequest, TooManyRequests
from protocol.events import ErrorEvent, ServerEvent
from protocol.items import InputItem
from protocol.response import CreateParams, Response, ResponseErrorInfo
from protocol.sse import frame
from protocol.states import ResponseState

if TYPE_CHECKING:
    from engine.rollout.turn import Turn

log = logging.getLogger("rollout.background")

UNFINISHED = ("queued", "in_progress")
ORPHANED = "The server that ran this background response stopped before it finished."
NOT_GENERATED = "The model failed to generate a response."
KEEP_FINISHED_LOGS = 64  # finished runs whose event logs stay replayable (BG-5)


class EventsExpired(Exception):
    """The reader asked for events that have left the bounded log (BG-5)."""


def frame_bytes(data: bytes) -> int:
    """What one kept frame occupies (MEM-10): the bytes object and its deque slot."""
    return sys.getsizeof(data) + LIST_SLOT


class LogBudget:
    """The bytes every background event log of this process holds, live and finished, in total
    and per owner (MEM-14). A log over either bound first gives up finished logs (``shed``,
    set by ``BackgroundRuns``), then its own oldest frames."""

    def __init__(self, total: int, per_owner: int) -> None:
        self.total = total
        self.per_owner = per_owner
        self.nbytes = 0
        self._owners: dict[str | None, int] = {}
        self.shed: Callable[[str | None], bool] = lambda _owner: False

    def charge(self, owner: str | None, nbytes: int) -> None:
        self.nbytes += nbytes
        held = self._owners.get(owner, 0) + nbytes
        if held:
            self._owners[owner] = held
        else:
            self._owners.pop(owner, None)

    def over(self, owner: str | None) -> bool:
        return self.nbytes > self.total or self._owners.get(owner, 0) > self.per_owner

    def owned(self, owner: str | None) -> int:
        return self._owners.get(owner, 0)


class EventLog:
    """A run's events as SSE frames, numbered by ``sequence_number``, bounded in bytes: its own
    bound (LIM-17) and the process's log budget, per owner (MEM-14).

    It is the run's sink: the rollout appends and never waits. Readers are woken by resolving
    the futures they parked on; nothing is allocated per event when nobody follows."""

    def __init__(
        self, max_bytes: int, budget: LogBudget | None = None, owner: str | None = None
    ) -> None:
        self.max_bytes = max_bytes
        self.budget = budget if budget is not None else LogBudget(max_bytes, max_bytes)
        self.owner = owner
        self.frames: deque[bytes] = deque()
        self.first_seq = 0  # sequence_number of frames[0]
        self.size = 0
        self.error: ErrorEvent | None = None  # a rejection before the response opened
        # An error after the response opened: its terminal record was not stored (STORE-8), so
        # the response did not complete, whatever its last event said (BG-10).
        self.late_error: ErrorEvent | None = None
        self.closed = False
        self._waiters: list[asyncio.Future[None]] = []

    @property
    def next_seq(self) -> int:
        return self.first_seq + len(self.frames)

    async def send(self, event: ServerEvent) -> None:
        if isinstance(event, ErrorEvent):
            self.error = event
            if self.frames:  # after the response opened: followers see it too (BG-10)
                self.late_error = event
                self._append(frame(event))
        else:
            self._append(frame(event))
        self._wake()

    def _append(self, data: bytes) -> None:
        self.frames.append(data)
        self._charge(frame_bytes(data))
        budget = self.budget
        while len(self.frames) > 1:
            if self.size <= self.max_bytes and not budget.over(self.owner):
                return
            if self.size <= self.max_bytes and budget.shed(self.owner):
                continue  # a finished log went first (MEM-14)
            self._charge(-frame_bytes(self.frames.popleft()))
            self.first_seq += 1

    def _charge(self, nbytes: int) -> None:
        self.size += nbytes
        self.budget.charge(self.owner, nbytes)

    def release(self) -> None:
        """The log is forgotten: its frames leave the budget (readers still following keep
        the frames they hold)."""
        self.budget.charge(self.owner, -self.size)
        self.size = 0
        self.first_seq += len(self.frames)  # a late reader is told they expired (BG-5)
        self.frames.clear()

    def close(self) -> None:
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def check_start(self, starting_after: int) -> None:
        if starting_after + 1 < self.first_seq:
            raise InvalidRequest(
                "invalid_value",
                f"Events before sequence_number {self.first_seq} are no longer available.",
                "starting_after",
            )

    async def follow(self, starting_after: int) -> AsyncIterator[bytes]:
        """Replay the frames after ``starting_after``, then follow until the log closes."""
        wanted = starting_after + 1
        while True:
            if wanted < self.first_seq:
                raise EventsExpired
            index = wanted - self.first_seq
            if index < len(self.frames):
                yield self.frames[index]
                wanted += 1
                continue
            if self.closed:
                return
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter


def unstored(response: Response, error: ErrorEvent) -> Response:
    """A response whose run ended in ``error`` (a rejection, or a terminal record the store did
    not take, BG-10): ``failed``, never the ``completed`` its last event may have said. The
    code is the SDK's ``server_error``; the message is the error's."""
    return msgspec.structs.replace(
        response,
        status="failed",
        error=ResponseErrorInfo(code="server_error", message=error.error.message),
        completed_at=response.completed_at or int(time.time()),
        output=list(response.output),
    )


class BackgroundRun:
    """One detached create: its session, its event log, its task."""

    def __init__(
        self,
        engine: Engine,
        params: CreateParams,
        log: EventLog,
        owner: str | None = None,
        quota: Quota | None = None,
        traceparent: str | None = None,
    ) -> None:
        self.engine = engine
        self.params = params
        self.owner = owner  # the API-key identity that created it (OWN-1)
        self.log = log
        self.session = Session(engine, self.log, transport="http", owner=owner, quota=quota)
        self.session.traceparent = traceparent  # the creating request's (OTEL-2)
        self.session.on_admitted = self._admitted
        self.turn: Turn | None = None
        self.at_admission: Response | None = None
        self.task: asyncio.Task[None] | None = None
        self._admission: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @property
    def response(self) -> Response:
        assert self.turn is not None
        return self.turn.stream.response

    def snapshot(self) -> Response:
        """The response as a poll sees it: ``queued`` until the model's first delta opens it."""
        response = self.response
        if self.log.late_error is not None:  # its terminal record was not stored (BG-10)
            return unstored(response, self.log.late_error)
        opened = self.turn is not None and self.turn.stream.state is not ResponseState.NEW
        # A run cancelled before its first delta ended all the same: its end, not ``queued``.
        status = response.status if opened or response.status not in UNFINISHED else "queued"
        if status not in UNFINISHED and self.turn is not None and not self.turn.done.done():
            status = "in_progress"  # terminal only once stored and sent (STORE-6)
        return msgspec.structs.replace(response, status=status, output=list(response.output))

    async def _admitted(self, turn: Turn, context: list[InputItem]) -> None:
        """Called by the create path once the request is admitted and prepared (BG-2). The
        record holds the prepared context (a snapshot, STORE-5), so a run that never ends
        properly (BG-7, BG-8) can still be continued from what it was asked. It is durable
        before the create answers, so a poll on any process finds it (STORE-6); a store that
        is down fails the create (STORE-8)."""
        self.turn = turn
        self.at_admission = self.snapshot()  # what the create answers: ``queued``
        record = chain_record(
            self.at_admission,
            [listing_form(item) for item in turn.input_items],
            context,
            None,
            owner=self.owner,
        )
        try:
            # The lease first: a reader on any node that finds the record unfinished also
            # finds who runs it, or knows nobody does (LIVE-1).
            await self.engine.leases.hold(record.response.id)
            await self.engine.store.put(record)
        except StoreError as exc:
            self.turn = None
            raise wire_error(exc) from None
        if not self._admission.done():
            self._admission.set_result(None)

    async def main(self) -> None:
        try:
            self.session.submit_create(self.params)
            await self.session.drain()
        finally:
            await self.session.close()
            await self._settle_unfinished()
            self.log.close()
            if not self._admission.done():
                self._admission.set_result(None)

    async def _settle_unfinished(self) -> None:
        """A run that ended without a terminal record (a backend refusal, a fault before the
        response opened) must not leave ``in_progress`` in the store (BG-8)."""
        if self.turn is None:
            return
        late = self.log.late_error
        if late is None and self.response.status not in UNFINISHED:
            return
        error = late or self.log.error
        response = unstored(self.response, error) if error is not None else self.response
        if error is None:
            response.status = "failed"
            response.error = ResponseErrorInfo(code="server_error", message=NOT_GENERATED)
            response.completed_at = int(time.time())
        try:
            record = await self.engine.store.get(response.id)
            if record is not None:
                settled = msgspec.structs.replace(response, output=list(response.output))
                await self.engine.store.put(msgspec.structs.replace(record, response=settled))
        except StoreError as exc:  # left in_progress: a later read settles it (BG-8)
            log.warning("background %s: not settled in the store: %s", response.id, exc)

    async def admitted(self) -> None:
        """Wait until the create is admitted, or rejected (then ``turn`` stays None and
        ``log.error`` holds the ``error`` the create produced, HTTP-4)."""
        assert self.task is not None
        await asyncio.wait([self._admission, self.task], return_when=asyncio.FIRST_COMPLETED)

    async def cancel(self) -> None:
        """Cancel the coroutine: the rollout records ``cancelled`` and accounts usage (BG-6)."""
        assert self.task is not None
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.engine.flush_writes()  # the cancelled record is stored before we answer


class BackgroundRuns:
    """Every live background run of this process, and the logs of recently finished ones."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.live: dict[str, BackgroundRun] = {}
        self._starting: set[BackgroundRun] = set()
        self.finished: OrderedDict[str, EventLog] = OrderedDict()
        budget = engine.config.budget
        self.budget = LogBudget(budget.background, budget.background_per_owner)
        self.budget.shed = self._shed_finished
        self._renewing: asyncio.Task[None] | None = None

    async def start(
        self,
        params: CreateParams,
        owner: str | None = None,
        quota: Quota | None = None,
        traceparent: str | None = None,
    ) -> BackgroundRun:
        """Start a run; returns once it is admitted or rejected (``run.turn`` is None, BG-2)."""
        config = self.engine.config
        if len(self.live) + len(self._starting) >= config.max_background_runs:
            raise TooManyRequests(
                "too_many_background_responses",
                f"At most {config.max_background_runs} background responses run at once.",
                None,
            )
        log = EventLog(config.background_log_bytes, self.budget, owner)
        run = BackgroundRun(self.engine, params, log, owner, quota, traceparent)
        self._starting.add(run)
        run.task = asyncio.create_task(run.main(), name="background")
        run.task.add_done_callback(lambda _: self._reap(run))
        try:
            await run.admitted()
        finally:
            self._starting.discard(run)
        if not run.task.done():
            self.live[run.response.id] = run
            if self.engine.handover.enabled and (self._renewing is None or self._renewing.done()):
                self._renewing = asyncio.create_task(self._renew(), name="background-leases")
        else:
            self._keep_log(run)
        return run

    def _reap(self, run: BackgroundRun) -> None:
        task = run.task
        assert task is not None
        if not task.cancelled() and task.exception() is not None:
            log.error("background run failed", exc_info=task.exception())
        if run.turn is not None and self.live.pop(run.response.id, None) is not None:
            self._keep_log(run)
            self.engine.leases.finished(run.response.id)

    async def _renew(self) -> None:
        """Renew every live run's lease each third of it, while any lives (LIVE-1). A renewal
        the store refuses is retried at the next beat; the lease outlives two misses."""
        while self.live:
            await asyncio.sleep(RUN_LEASE_S / 3)
            for response_id in list(self.live):
                try:
                    await self.engine.leases.hold(response_id)
                except StoreError as exc:
                    log.warning("background %s: lease not renewed: %s", response_id, exc)
                    break

    def _keep_log(self, run: BackgroundRun) -> None:
        if run.turn is None:
            run.log.release()
            return
        self.finished[run.response.id] = run.log
        while len(self.finished) > KEEP_FINISHED_LOGS:
            self.finished.popitem(last=False)[1].release()
        while self.budget.over(run.owner) and self._shed_finished(run.owner):
            pass

    def _shed_finished(self, owner: str | None) -> bool:
        """Forget the oldest finished log that frees what is over the budget (MEM-14): the
        owner's own when the owner is over its part, else any. False when none is left."""
        mine = self.budget.owned(owner) > self.budget.per_owner
        for response_id, log in self.finished.items():
            if not mine or log.owner == owner:
                del self.finished[response_id]
                log.release()
                return True
        return False

    def find(self, response_id: str) -> BackgroundRun | None:
        """The run of this process behind ``response_id``: live, or admitted and stored but
        not yet listed live (a read in that moment must not take it for orphaned, LIVE-3)."""
        run = self.live.get(response_id)
        if run is not None:
            return run
        for starting in self._starting:
            if starting.turn is not None and starting.response.id == response_id:
                return starting
        return None

    def event_log(self, response_id: str) -> EventLog | None:
        run = self.find(response_id)
        return run.log if run is not None else self.finished.get(response_id)

    @property
    def busy(self) -> bool:
        return bool(self.live or self._starting)

    def sessions(self) -> list[Session]:
        """The live runs' sessions (the inspector lists them like in-flight HTTP creates)."""
        return [run.session for run in self.live.values()]

    async def close(self) -> None:
        """Shutdown, after the grace period: cancel what still runs (LIM-13, BG-6)."""
        if self._renewing is not None:
            self._renewing.cancel()
            await asyncio.gather(self._renewing, return_exceptions=True)
        runs = [*self.live.values(), *self._starting]
        for run in runs:
            if run.task is not None:
                run.task.cancel()
        tasks = [run.task for run in runs if run.task is not None]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def settle(self, record: ResponseRecord, gone: bool = False) -> ResponseRecord:
        """A stored unfinished background response that no live run of this process owns is
        orphaned when nobody holds its lease (LIVE-1), when the node holding it says it runs
        nothing of the kind (``gone``, LIVE-3), or, where nothing is shared, when it is older
        than any run can last (BG-8): its process is gone."""
        response = record.response
        if not response.background or response.status not in UNFINISHED:
            return record
        if self.find(response.id) is not None:
            return record
        finished = self.finished.get(response.id)
        if finished is not None and finished.late_error is not None:
            # Ran here, and its terminal record was not stored: failed now (BG-10).
            settled = unstored(response, finished.late_error)
        elif gone or await self._lease_lost(response):
            settled = orphaned(response)
        elif time.time() - response.created_at < self.engine.config.background_orphan_after_s:
            return record
        else:
            settled = orphaned(response)
        record = msgspec.structs.replace(record, response=settled)
        try:
            await self.engine.store.put(record)
        except StoreError as exc:  # the reader still gets the settled response
            log.warning("background %s: not settled in the store: %s", response.id, exc)
        self.engine.counters["background.settled"] += 1
        return record

    async def _lease_lost(self, response: Response) -> bool:
        """Nobody holds the run's lease (LIVE-1): its node died, or stopped renewing it. Only
        where leases are kept; a store that cannot say keeps the record as it is."""
        if not self.engine.handover.enabled:
            return False
        try:
            return await self.engine.leases.running_at(response.id) is None
        except StoreError:
            return False


def orphaned(response: Response) -> Response:
    """An unfinished background response whose process is gone: ``failed`` (BG-8, LIVE-1)."""
    return msgspec.structs.replace(
        response,
        status="failed",
        error=ResponseErrorInfo(code="server_error", message=ORPHANED),
        completed_at=int(time.time()),
    )
