"""How a rollout's responses and the rollout itself end (SPEC: STORE-6, STORE-8, STORE-21,
STORE-30, ROLL-7, ROLL-9, MODEL-5, ERR-3, POST-1, POST-5).

A response ends with its durable write (``store: true``), then its terminal frame, then its
ledger record (standard mode). The rollout ends once: its stage counters join the engine's and
the record it still owes is handed to post-inference. ``Endings`` does these for one rollout;
the rollout decides when.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref

from engine.observe.accounting import safety_report
from engine.observe.postinference import UsageRecord
from engine.rollout.hosted import as_input
from engine.rollout.rollout_core import RolloutCore
from engine.rollout.state import RolloutState, RolloutStep
from engine.rollout.training import settle
from engine.rollout.turn import ClientGone, Mode, Turn, TurnNotStored, now
from engine.store import ResponseRecord, StoreError, chain_record, listing_form
from engine.store.failures import terminal_write_error
from engine.store.memory import MemoryStore
from protocol import events as ev
from protocol.codec import error_event
from protocol.errors import ProtocolError
from protocol.states import TERMINAL_STATES, ResponseState

log = logging.getLogger("rollout.rollout")


class Endings:
    def __init__(self, rollout: RolloutCore) -> None:
        # A proxy, not a reference: the rollout owns its endings, and a finished rollout is
        # freed by reference counting alone, never left for the cyclic collector (ROLL-9).
        self._rollout: RolloutCore = weakref.proxy(rollout)
        # A standard response whose terminal event is built but whose ledger record is not yet
        # handed over: billed by whichever ending comes next, whatever the client does (POST-5).
        self._owed: Turn | None = None

    async def warm(self) -> None:
        """``generate: false``: state is prepared and the response completes with no output."""
        rollout = self._rollout
        turn = rollout.turn
        rollout.accounting.count_prompt(turn, rollout.ctx.prompt_tokens)
        await turn.sink.send(turn.stream.created())
        with contextlib.suppress(TurnNotStored):  # the error frame has been sent
            await self.end_turn(turn, "completed")
        await self.end()

    async def end_turn(
        self,
        turn: Turn,
        status: str,
        reason: str | None = None,
        failure: str | None = None,
    ) -> None:
        """The response's terminal frame; in standard mode also its ledger record (POST-1)."""
        rollout = self._rollout
        stream, at = turn.stream, now()
        stream.response.safety = safety_report(rollout.pipeline.policy, turn.log.findings)
        usage = turn.tally.usage()
        if status == "completed":
            event: ev.ServerEvent = stream.completed(usage, at)
        elif status == "incomplete":
            event = stream.incomplete(reason or "max_output_tokens", usage, at)
        else:
            message = failure or "The model failed to generate a response."
            event = stream.failed("server_error", message, usage, at)
        settle(turn, event)  # a cut item's training fields (TOK-60)
        turn.status = status
        if rollout.mode is Mode.STANDARD:
            self._owed = turn  # from here on it is billed, even if the client leaves (POST-5)
        try:
            await self._join(turn, status)  # the conversation's append first (CONV-5)
            await self._store(turn)  # durable before the terminal frame (STORE-6)
        except StoreError as exc:
            await self._unstored(turn, exc)
            raise TurnNotStored from exc
        try:
            turn.hand_over()
            await turn.sink.send(event)
        finally:
            turn.settle()
        rollout.accounting.time_turn(turn, rollout.ctx.prompt_tokens)
        await self._bill_owed(waiting=True)

    async def _bill_owed(self, *, waiting: bool) -> None:
        """Hand the owed standard-mode record to post-inference, exactly once (POST-1, POST-5).
        A cancelled caller cannot wait for queue space: ``waiting=False`` never suspends, and a
        cancel while waiting still hands the record over before it propagates."""
        turn, self._owed = self._owed, None
        if turn is None:
            return
        record = self._record([turn.stream.id], turn)
        post = self._rollout.engine.post
        if not waiting:
            post.submit_nowait(record)
            return
        try:
            await post.submit(record)
        except asyncio.CancelledError:  # the put did not happen: a queue put is all or nothing
            post.submit_nowait(record)
            raise

    async def _store(self, turn: Turn) -> None:
        rollout = self._rollout
        if not rollout.settings.store:
            return
        record = self.stored_record(turn)
        start = time.perf_counter()
        write = asyncio.ensure_future(self._durable(record, turn.status))
        try:
            await asyncio.shield(write)
        except asyncio.CancelledError:
            # A cancel landing during the durable write (a client gone, a background cancel):
            # it is billed at once (POST-5: billing never waits on the store), and the write is
            # not abandoned half-way, so the response ends stored as completed, never neither
            # stored nor cancelled (STORE-21). The store bounds the wait (STORE-8, STORE-18),
            # whatever cancels follow: a retried cancel, a DELETE, shutdown (STORE-30).
            await self._bill_owed(waiting=False)
            await _outlast_cancels(write)
            raise
        turn.log.add_time("store", time.perf_counter() - start)  # OBS-1
        rollout.ctx.stored = record.point
        if record.tokens is not None and rollout.ctx.model_tokens is not None:
            rollout.ctx.model_tokens.mark_stored()

    async def _durable(self, record: ResponseRecord, status: str) -> None:
        """The record's write (STORE-6) and, in a cluster, beside it and at once, its entry in
        the resend index, so a resend sent after the terminal frame finds it on any node
        (COMPAT-10)."""
        rollout = self._rollout
        engine = rollout.engine
        if status not in ("completed", "incomplete") or not engine.resends.enabled:
            await engine.store.put(record)
            return
        ctx = rollout.ctx
        ctx.resend = ctx.resend.over(ctx.items)  # only the items new since it was last taken
        index = engine.resends.publish(rollout.owner, ctx.resend.digest, record.id)
        await asyncio.gather(engine.store.put(record), index)

    async def _join(self, turn: Turn, status: str) -> None:
        """Append the response's input and output to its conversation, and let the
        conversation go (CONV-5, CONV-7); its stored context now stands for all of the
        conversation (CONV-6)."""
        joined, turn.conversation = turn.conversation, None
        if joined is None:
            return
        # Before the response's own write, so a reader that sees it ended sees its items (a
        # background poll, BG-3); should that write then fail, the conversation's next create
        # finds no such response and renders the items instead (CONV-6).
        stored_as = turn.stream.id if self._rollout.settings.store else None
        successor = turn.successor  # a steered response's: it holds the conversation next
        then = successor.input_items if successor is not None else None
        output = [as_input(item) for item in turn.stream.response.output]
        handed = await joined.finish(status, output, stored_as, then)
        if successor is not None:
            successor.conversation = handed

    def stored_record(self, turn: Turn) -> ResponseRecord:
        """Flat: this response's own input, output and new context items (STORE-4), and the
        token trajectory's new part (TOK-8)."""
        ctx, store = self._rollout.ctx, self._rollout.engine.store
        parent = ctx.stored
        if parent is not None and isinstance(store, MemoryStore) and not store.holds_chain(parent):
            parent = None  # an ancestor was evicted or expired (LIM-5, MEM-15): snapshot (STORE-2)
        record = chain_record(
            turn.stream.response,
            [listing_form(item) for item in turn.input_items],
            ctx.items,
            parent,
            owner=self._rollout.owner,
        )
        trajectory = ctx.model_tokens
        if trajectory is not None and trajectory.covered == len(ctx.items):
            record.tokens = trajectory.segment(snapshot=not record.links)
            if record.tokens is not None:  # only a tokens backend names its weights (EXPORT-4)
                record.tokens.weights = self._rollout.backend.weights
        return record

    async def _unstored(self, turn: Turn, exc: StoreError) -> None:
        """The store did not acknowledge: the client gets an ``error`` instead of the terminal
        frame, so it never holds an id it cannot continue (STORE-8). Usage is still billed, and
        the error is a 500: the request did its work and is never run again (RETRY-2)."""
        log.warning("rollout %s: response %s not stored: %s", self._rollout.id, turn.stream.id, exc)
        turn.status = "failed"
        orphan, turn.successor = turn.successor, None  # its successor never begins (STEER-3)
        if orphan is not None and orphan.conversation is not None:  # so it lets go (CONV-7)
            await orphan.conversation.opened.lock.release()
        await self._bill_owed(waiting=False)
        try:
            await turn.sink.send(
                error_event(terminal_write_error(exc), stream_id=turn.stream.stream_id)
            )
        except ClientGone:
            pass
        finally:
            turn.settle()

    async def fail_quietly(
        self, refusal: ProtocolError | None = None, failure: str | None = None
    ) -> None:
        """A backend's refusal before the response opened is an ``error`` with the backend's
        status and no response (MODEL-5); any other fault is a ``response.failed``
        (``server_error``, ERR-3), with the fault's own message when it names a code
        (``failure``, TOK-33)."""
        rollout = self._rollout
        turn = rollout.turn
        with contextlib.suppress(Exception):
            if turn.stream.state is ResponseState.NEW and refusal is not None:
                await turn.sink.send(error_event(refusal, stream_id=turn.stream.stream_id))
            elif turn.stream.state not in TERMINAL_STATES:
                await rollout.open_turn(turn)
                await self.end_turn(turn, "failed", failure=failure)
        turn.status = "failed"
        await rollout.steering.fail_all(turn, "response_not_active", "The response failed.")
        await self.end()

    async def end(self, *, cancelled: bool = False) -> None:
        """The one ending of a rollout, run once: its stage counters join the engine's and the
        ledger record still owed is handed to post-inference (POST-1): the rollout's one
        response in append mode, an open response in standard mode.

        ``cancelled``: the task was cancelled, the client left, or a suspended append rollout
        was retired. A response still open is stored as ``cancelled`` and billed, and the record
        is handed over without waiting, so a cancelled task never suspends here."""
        await self._bill_owed(waiting=not cancelled)  # a terminal frame the client missed
        rollout = self._rollout
        turn, engine = rollout.turn, rollout.engine
        billed_open = cancelled and turn.stream.state not in TERMINAL_STATES
        if billed_open:
            settle(turn, keep_open=True)  # a cancelled step's training fields (TOK-60)
            response = turn.stream.response
            response.status = turn.status = "cancelled"
            response.completed_at = now()
            # What it used is reported and billed (ROLL-7, BG-6).
            append = rollout.mode is Mode.APPEND
            response.usage = (rollout.accounting.totals if append else turn.tally).usage()
            if rollout.settings.store:  # nobody waits for this one: written in the background
                engine.store_later(self.stored_record(turn))
        if rollout.state is RolloutState.ENDED:
            return
        rollout.advance(RolloutStep.END)
        engine.stats.add(rollout.accounting.stats)
        if rollout.mode is Mode.APPEND:
            record = self._record(rollout.response_ids, turn, whole_rollout=True)
        elif billed_open:
            record = self._record([turn.stream.id], turn)
        else:
            return
        if cancelled:
            engine.post.submit_nowait(record)
        else:
            await engine.post.submit(record)

    def _record(
        self, response_ids: list[str], turn: Turn, *, whole_rollout: bool = False
    ) -> UsageRecord:
        rollout = self._rollout
        tally = rollout.accounting.totals if whole_rollout else turn.tally
        record = rollout.accounting.record(
            rollout.settings.model, turn.status, response_ids, tally, turn.log
        )
        record.trace = turn.trace  # post-inference's span joins the response's (OTEL-3)
        return record


async def _outlast_cancels(write: asyncio.Future[None]) -> None:
    """Wait for a shielded durable write to end, however many further cancels reach this task
    (STORE-30): each one is absorbed here, since a plain ``await write`` would pass the next
    cancel on to the write and abandon it. The caller then raises the cancellation it caught,
    which stands for all of them. The write's own failure is the store's to report (STORE-8)."""
    while not write.done():
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.shield(write)
    if not write.cancelled():
        write.exception()  # retrieved: a failed write is not an unhandled task error
