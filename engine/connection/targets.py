"""What a steer, an append or an inject names: a response of this connection, live or ended
(SPEC: STEER-1..STEER-7, APPEND-3..APPEND-6, INJECT-1..INJECT-9).

A client's ``response.steer``, ``response.append`` and ``response.inject`` each name a response
by id and deliver input into the rollout producing it, or are refused precisely: not found,
already completed, not waiting. ``Targets`` keeps what that takes beyond the session's lanes
and rollouts, which it reads and never changes: the live append-mode responses (APPEND-3), the
recently ended ones (``ended.py``) and the standard-mode injects waiting for their siblings
(``inject.py``). The session queues creates (an inject's continuation too) and owns the tasks;
it hands these verbs here.
"""

from __future__ import annotations

import asyncio

from engine.connection.ended import Ended, ended_with
from engine.connection.inject import (
    HeldOutputs,
    inject_failed,
    tool_outputs,
    unknown_target,
    waiting_standard,
)
from engine.connection.lane import Lane, latest_of
from engine.conversation.validation import validate
from engine.rollout.coroutine import Rollout
from engine.rollout.steering import Steer, echo, steer_items, unattached
from protocol.errors import InvalidRequest, ProtocolError
from protocol.events import ResponseAppend, ResponseInject, ResponseSteer, Sink, SteerRef
from protocol.response import CreateParams
from protocol.stream import new_id


class Targets:
    def __init__(
        self,
        lanes: dict[str | None, Lane],
        rollouts: dict[asyncio.Task[None], Rollout],
        sink: Sink,
        *,
        multi_agent: bool,
    ) -> None:
        self._lanes = lanes  # the session's, read here
        self._rollouts = rollouts  # the session's live rollout tasks, read here
        self._sink = sink
        # The upgrade opted into OpenAI's multi-agent beta: standard-mode responses take
        # response.inject (INJECT-1).
        self.multi_agent = multi_agent
        self._held = HeldOutputs()  # standard-mode injects waiting for their siblings
        self._append_targets: dict[str, Rollout] = {}  # live append-mode responses
        self._ended = Ended()  # for precise late-steer and late-append errors

    # ------------------------------------------------------------------ bookkeeping
    def serving(self, response_id: str, append_target: Rollout | None) -> None:
        """A create's response is being produced; an append-mode one takes appends (APPEND-3)."""
        if append_target is not None:
            self._append_targets[response_id] = append_target

    def served(self, response_id: str) -> None:
        """It reached its terminal event: later steers and appends hear so (STEER-7, APPEND-5)."""
        self._ended.add(response_id, append=self._append_targets.pop(response_id, None) is not None)

    def clear(self) -> None:
        self._append_targets.clear()

    def has_finished(self, response_id: str) -> bool:
        """A response of this connection that reached its terminal event (STEER-7)."""
        if latest_of(self._lanes.values(), response_id) is not None:
            return True
        return self._ended.response(response_id, self._rollouts.values())

    def _append_target(self, response_id: str) -> Rollout | None:
        """The live append-mode rollout named: none once its terminal frame is out (APPEND-5)."""
        rollout = self._append_targets.get(response_id)
        return None if rollout is None or ended_with(rollout, response_id) else rollout

    def finished_append(self, response_id: str) -> bool:
        """An append-mode response of this connection that ended (APPEND-5)."""
        return self._ended.append(response_id, self._append_targets.get(response_id))

    def lane_of(self, event: ResponseAppend | ResponseInject) -> str | None:
        """The lane an append's or inject's request-scoped error is attributed to (EV-3)."""
        target = self._append_target(event.response_id)
        if target is None and isinstance(event, ResponseInject) and self.multi_agent:
            live = (r for r in self._rollouts.values() if r.steerable(event.response_id))
            target = next(live, None)  # a standard-mode target's lane (INJECT-8)
        return target.turn.stream.stream_id if target is not None else None

    # ------------------------------------------------------------------ the verbs
    async def steer(self, event: ResponseSteer) -> None:
        """Accept, queue or refuse one ``response.steer`` (STEER-1..STEER-7)."""
        target = event.previous_response_id
        rollout = next((r for r in self._rollouts.values() if r.steerable(target)), None)
        if rollout is None:
            await self._sink.send(unattached(event, await self._finished(target, append=False)))
            return
        stream = rollout.turn.stream
        refused = SteerRef(previous_response_id=target, input=echo(event.input))
        try:
            items = steer_items(event.input)
            validate(rollout.ctx, items, rollout.backend.supports)
        except ProtocolError as err:
            await self._sink.send(stream.steer_failed(refused, "invalid_input", err.message))
            return
        await rollout.steer(Steer(new_id("steer"), items, event.input, target))

    async def append(self, event: ResponseAppend | ResponseInject) -> CreateParams | None:
        """Commit tool outputs into a response that waits for them: an append-mode response
        (APPEND-3..APPEND-6), or with the multi-agent beta a standard-mode one (INJECT-1..9).
        Returns the create that continues a standard-mode one, once its calls are all answered,
        for the session to queue on its lane (INJECT-5)."""
        rollout = self._append_target(event.response_id)
        if rollout is None:
            if isinstance(event, ResponseInject):  # OpenAI's beta shape for these (INJECT-6)
                return await self._inject_standard(event)
            finished = await self._finished(event.response_id, append=True)
            raise unknown_target(event.response_id, finished)
        complete = rollout.offer(tool_outputs(event.input))  # raises without any change
        if isinstance(event, ResponseInject):
            await self._sink.send(rollout.turn.stream.inject_created())
        if complete:
            rollout.resume(rollout.turn)
        return None

    async def _finished(self, response_id: str, *, append: bool) -> bool:
        """Whether a steer's (or with ``append``, an append's) target is a response of this
        connection that ended, answered once its terminal frame is in the sink: between a
        terminal event built and its frame comes its durable write (STORE-6), and a refusal as
        already completed sent there would reach the client before the response's own end
        (STEER-7, APPEND-5)."""
        for rollout in self._rollouts.values():
            if rollout.turn.stream.id == response_id:
                await rollout.turn.terminal_written()
                break
        return self.finished_append(response_id) if append else self.has_finished(response_id)

    async def _inject_standard(self, event: ResponseInject) -> CreateParams | None:
        """A standard-mode target (INJECT-2, INJECT-5): its outputs are held until its calls
        are all answered, then continue it as a create queued on its lane (the fast path)."""
        target, multi_agent = event.response_id, self.multi_agent
        found = waiting_standard(self._lanes.values(), target) if multi_agent else None
        if found is None:
            running = any(r.steerable(target) and not r.waiting for r in self._rollouts.values())
            if running and multi_agent:  # it samples: outputs come after its calls (INJECT-7)
                raise _not_waiting()
            finished = self.finished_append(target) or (multi_agent and self.has_finished(target))
            await self._sink.send(inject_failed(event, finished))
            return None
        continuation = self._held.accept(self._lanes.values(), found, event)
        await self._sink.send(found[2].turn.stream.inject_created())
        return continuation


def _not_waiting() -> ProtocolError:
    return InvalidRequest(
        "response_not_waiting", "The response is not waiting for tool outputs.", None
    )
