"""THE coroutine: one agentic rollout (SPEC: ROLL-1..ROLL-8).

    prepare (pre-inference over the input, once)
    loop:  sample -> tool calls?  -> suspend on a Future -> resume with only the new items
    finish (post-inference, once, handed to the background worker)

The rollout keeps the loop and the Future it suspends on, over its ``RolloutCore``
(``rollout_core.py``: its state, its context and the pre-inference that feeds it, what the
endings and a sampling step use); what it works with lives beside it: the response being
produced and its settings (``turn.py``), its lifecycle table (``state.py``),
its steering queue (``steering.py``, reached through ``steer``), its books (``accounting.py``)
and one sampling step's event emission (``sampling.py``). Sessions talk to it through ``offer``
(new items, validated and rendered incrementally, atomically), ``continue_standard``, ``steer``
and ``retire``. In append mode the whole rollout is one response (``response.done`` at each
suspension); in standard mode every sampling turn is its own response and the compat layer
hands in a new ``Turn`` on resume.
"""

from __future__ import annotations

import asyncio
import logging

from engine.conversation.context import Context
from engine.conversation.pipeline import FULL, INCREMENTAL, ItemTexts
from engine.core import Engine
from engine.models.base import Backend, BackendError
from engine.rollout.deadline import Deadline
from engine.rollout.endings import Endings
from engine.rollout.rollout_core import RolloutCore, require_answers, unanswered
from engine.rollout.sampling import compact_if_needed, sample
from engine.rollout.state import RolloutState, RolloutStep
from engine.rollout.steering import Steer
from engine.rollout.turn import (
    DETACHED,
    ClientGone,
    Mode,
    SampleEnd,
    Settings,
    Turn,
    TurnNotStored,
    share_echoes,
)
from protocol.errors import InvalidRequest
from protocol.events import Sink
from protocol.items import InputItem, ToolCall
from protocol.states import TERMINAL_STATES

log = logging.getLogger("rollout.rollout")


class Rollout(RolloutCore):
    """The coroutine over its ``RolloutCore``: the loop, the Future it suspends on, and the
    verbs sessions use (``offer``, ``continue_standard``, ``steer``, ``retire``)."""

    def __init__(
        self,
        engine: Engine,
        backend: Backend,
        settings: Settings,
        turn: Turn,
        mode: Mode,
        context: Context | None = None,
    ) -> None:
        super().__init__(engine, backend, settings, turn, mode, context)
        self.pending: list[ToolCall] = []  # the calls of its current suspension (INSP-4)
        self.endings = Endings(self)
        self._wake: asyncio.Future[Turn | None] | None = None
        self._idle = Deadline(self.loop)  # the idle limit of each suspension (ROLL-6)
        self._model_timeout = engine.config.model_timeout_s

    # ================================================================== the coroutine
    async def run(self) -> None:
        """Task body. Owned by the session that started it."""
        endings = self.endings
        try:
            await self._loop()
        except asyncio.CancelledError:
            await endings.end(cancelled=True)  # never suspends: the task is being cancelled
            raise
        except ClientGone:
            await endings.end(cancelled=True)
        except TurnNotStored:
            await endings.end()
        except BackendError as exc:
            log.warning("rollout %s: backend failed: %s", self.id, exc)
            await endings.fail_quietly(exc.protocol_error(), exc.failure())
        except TimeoutError:
            log.warning("rollout %s: model exceeded %.0f s", self.id, self._model_timeout)
            await endings.fail_quietly()
        except Exception:
            log.exception("rollout %s failed", self.id)
            await endings.fail_quietly()
        finally:
            self.advance(RolloutStep.END)
            _settle_chain(self.turn)
            for deadline in (self._idle, self.model_deadline):  # no timer outlives it
                deadline.close()
            await self.hosted.aclose()  # its MCP sessions end with it (MCP-12)

    async def _loop(self) -> None:
        turn = self.turn
        while True:
            calls, reason = await self._sample(turn)
            if calls and reason != "length":
                next_turn = await self._suspend(turn, calls)
                if next_turn is None:
                    break
                if next_turn is not turn:
                    turn = self.turn = next_turn
                else:  # append mode: queued steering joins after the tool outputs (STEER-5)
                    turn.stream.resume()
                    self._commit(self.steering.take())
                continue
            if self.hosted.again(self.ctx, turn.stream.id, reason):  # MCP outputs joined (MCP-7)
                continue
            # Accepted steering input continues the rollout in a successor response (STEER-3).
            successor = turn.successor = self.steering.successor(turn) if self.steering else None
            if reason == "steered":
                await self.endings.end_turn(turn, "incomplete", reason="steered")
            elif reason == "length":
                await self.endings.end_turn(turn, "incomplete", reason="max_output_tokens")
            else:
                await self.endings.end_turn(turn, "completed")
            if successor is None:
                break
            turn = self._begin_successor(successor)
        await self.endings.end()

    async def _sample(self, turn: Turn) -> tuple[list[ToolCall], SampleEnd]:
        await self.hosted.before_sampling(self, turn, self.settings.tools)  # MCP-4, MCP-9
        if await compact_if_needed(self, turn, self._model_timeout):  # a compaction_trigger:
            return [], "stop"  # the response's one output is the compaction (COMPACT-7)
        step = self.accounting.begin_step(turn, self.ctx.prompt_tokens)
        await sample(self, turn, step, self._model_timeout)
        self.accounting.end_step(turn, step)
        return step.calls, step.reason

    # ================================================================== suspend / resume
    async def _suspend(self, turn: Turn, calls: list[ToolCall]) -> Turn | None:
        """Wait for tool outputs. Returns the turn to continue in, or None when retired."""
        self.pending = calls
        self.ctx.compact()  # it may wait a long time: hold only what it uses
        self._wake = self.loop.create_future()
        self.advance(RolloutStep.SUSPEND)
        if self.mode is Mode.APPEND:
            await turn.sink.send(turn.stream.suspend(calls))
            self.accounting.time_turn(turn, self.ctx.prompt_tokens)
        else:
            await self.endings.end_turn(turn, "completed")
        await self.steering.notify_pending(turn, self.ctx.pending_calls())
        try:
            async with self._idle.within(self.engine.config.suspended_idle_timeout_s):
                next_turn = await self._wake
        except TimeoutError:
            next_turn = None
            if self.mode is Mode.APPEND:
                self.advance(RolloutStep.WAKE)
                await self.endings.end_turn(turn, "incomplete", reason="idle_timeout")
        finally:
            self._wake = None
        if next_turn is not None:
            self.advance(RolloutStep.WAKE)
            self.pending = []
            return next_turn
        # Retired or timed out: queued steering input was never committed (STEER-6).
        await self.steering.fail_all(turn, "response_not_active", "The response stopped waiting.")
        if self.mode is Mode.APPEND:
            await self.endings.end(cancelled=True)  # retired by a closing connection: billed
        return None

    @property
    def idle_for(self) -> float | None:
        """Seconds on the suspension's idle clock (ROLL-6, INSP-4), None when not suspended."""
        return self._idle.elapsed()

    @property
    def pending_calls(self) -> list[ToolCall]:  # unanswered ones, for observers
        return self.ctx.pending_calls() if self.state is RolloutState.SUSPENDED else []

    @property
    def waiting(self) -> bool:
        suspended = self.state is RolloutState.SUSPENDED
        return suspended and self._wake is not None and not self._wake.done()

    def detach(self) -> None:  # parked (PARK-1): its old socket's buffers can be freed
        self.turn.sink = DETACHED

    @property
    def retained_bytes(self) -> int:  # what parking it costs (PARK-7)
        return self.ctx.retained_bytes

    def offer(self, items: list[InputItem], texts: ItemTexts | None = None) -> bool:
        """Commit new items (incremental pre-inference). Raises ``InvalidRequest`` without any
        change when they are not acceptable. Returns True when every pending call is answered."""
        if not self.waiting:
            raise InvalidRequest(
                "response_not_waiting", "The response is not waiting for tool outputs.", None
            )
        self.accounting.offered(self._apply(items, INCREMENTAL, texts=texts))
        if self._idle.when() is not None:  # accepted input restarts the idle clock (APPEND-6)
            limit = self.engine.config.suspended_idle_timeout_s
            self._idle.reschedule(self.loop.time() + limit)
        return not unanswered(self.ctx, items)

    def resume(self, turn: Turn, settings: Settings | None = None) -> None:
        """Wake the coroutine: in the same response (append) or in a new one (standard)."""
        if settings is not None:
            self.accounting.rendered(self._render_header(settings))
            self.settings = settings
        if turn is not self.turn:
            self.response_ids.append(turn.stream.id)
            share_echoes(self.turn, turn)
        assert self._wake is not None
        self._wake.set_result(turn)
        self.accounting.ready()

    def continue_standard(
        self, items: list[InputItem], texts: ItemTexts, turn: Turn, settings: Settings
    ) -> None:
        """Compat fast path: the new request answers the pending calls; resume in a new response."""
        if not self.waiting:
            raise InvalidRequest("response_not_waiting", "The response cannot be continued.", None)
        require_answers(self.ctx, items, self.backend.supports)
        previous_log, self.pipeline.log = self.pipeline.log, turn.log
        steered = self.steering.items()
        try:
            # Queued steering input is prepended to this request's input (STEER-5). If the
            # request is then refused, the create fails, the rollout is retired and the steers
            # are returned (STEER-6): they stay queued until the offer succeeds.
            if steered:
                self._commit(steered)
            self.offer(items, texts)
        except Exception:
            self.pipeline.log = previous_log
            raise
        self.steering.clear()
        turn.input_items = [*steered, *turn.input_items]
        self.resume(turn, settings)

    def retire(self) -> None:  # no further sampling (evicted, replaced or closed)
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    # ================================================================== steering
    def steerable(self, response_id: str) -> bool:
        """Whether a steer naming ``response_id`` targets this rollout (STEER-1): it is the
        current response and it is sampling, or it waits for tool outputs."""
        if self.state is RolloutState.ENDED or self.turn.stream.id != response_id:
            return False
        return self.waiting or self.turn.stream.state not in TERMINAL_STATES

    async def steer(self, steer: Steer) -> None:
        """Queue accepted steering input (STEER-2), or refuse it at the limit (LIM-14)."""
        waiting_for = self.ctx.pending_calls() if self.waiting else None
        await self.steering.submit(steer, self.turn, waiting_for)

    def _begin_successor(self, successor: Turn) -> Turn:
        self.steering.clear()
        self.turn = successor
        self.response_ids.append(successor.stream.id)
        self.pipeline.log = successor.log
        self._commit(successor.input_items)
        return successor

    def _commit(self, items: list[InputItem]) -> None:
        """Steering input joins the context (STEER-3, STEER-5)."""
        if items:
            self._apply(items, INCREMENTAL, param="steer")


def _settle_chain(first: Turn) -> None:
    """The turn ends, and a successor that never began ends with it."""
    status, turn = first.status, first
    while True:
        turn.settle(status)
        if turn.successor is None:
            break
        turn = turn.successor


__all__ = [
    "FULL",
    "INCREMENTAL",
    "ClientGone",
    "Mode",
    "Rollout",
    "Settings",
    "Sink",
    "Turn",
]
