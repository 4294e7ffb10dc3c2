"""One sampling step on the wire (SPEC: ROLL-2, ORD-*, MODEL-5, STEER-3).

The model's deltas become the response's events: a message opens at the first text, a function
call closes the message before it, the step's output joins the context at its end. The
response opens at the model's first delta, so a backend that refuses the request (an upstream
4xx) yields a plain ``error`` and no response at all (MODEL-5).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import msgspec

from engine.conversation.compaction import worth_compacting
from engine.conversation.pipeline import OUTPUT
from engine.models.base import (
    ArgsDelta,
    CallEnd,
    CallStart,
    Delta,
    Finish,
    ReasoningDelta,
    SampleRequest,
    StepTokens,
    TextDelta,
)
from engine.models.compaction import CompactRequest, compact
from engine.models.tracecontext import TRACEPARENT
from engine.rollout.accounting import SamplingStep
from engine.rollout.hosted import call_form, join
from engine.rollout.rollout_core import RolloutCore
from engine.rollout.sealing import StepSeal
from engine.rollout.training import HeldDone, step_ended
from engine.rollout.turn import Turn
from protocol.items import InputItem, OutputItem
from protocol.response import Response, RolloutTokens, SampleTokens
from protocol.states import ResponseState
from protocol.stream import ResponseStream


async def compact_if_needed(rollout: RolloutCore, turn: Turn, model_timeout: float) -> bool:
    """Before sampling: the input ended with a ``compaction_trigger`` (COMPACT-7: compact
    instead of sampling; returns True), or ``context_management`` and the context is past its
    threshold (COMPACT-3: compact, then sample). The compaction item is the response's next
    output item; its cost joins the usage."""
    if rollout.settings.compact_now:
        rollout.settings.compact_now = False
        await compact_context(rollout, turn, model_timeout, triggered=True)
        return True
    threshold, ctx = rollout.settings.compact_threshold, rollout.ctx
    if threshold is None or ctx.prompt_tokens <= threshold or not worth_compacting(ctx.items):
        return False
    await compact_context(rollout, turn, model_timeout, triggered=False)
    return False


async def compact_context(
    rollout: RolloutCore, turn: Turn, model_timeout: float, *, triggered: bool
) -> None:
    """Replace the context by its compacted window; the compaction item is the response's next
    output item and its cost joins the usage (COMPACT-3; COMPACT-7 when ``triggered``)."""
    request = CompactRequest(rollout.settings.model, rollout.ctx, keep_round=not triggered)
    async with asyncio.timeout(model_timeout):  # an upstream compaction is a model call
        result = await compact(rollout.backend, request)
    rollout.replace_context(result.items)
    rollout.engine.counters["compaction.trigger" if triggered else "compaction.auto"] += 1
    rollout.accounting.count_compaction(turn, result.input_tokens, result.output_tokens)
    await rollout.open_turn(turn)
    for event in turn.stream.add_compaction(result.item):
        await turn.sink.send(event)


async def sample(
    rollout: RolloutCore, turn: Turn, step: SamplingStep, model_timeout: float
) -> None:
    """Run one step to its end; ``step`` says how it ended (calls, reason). With training
    fields asked (TOK-60, TOK-61) its last item carries them, however it ends."""
    if not (rollout.settings.training_fields and rollout.backend.renders_own_tokens):
        await _sample(rollout, turn, step, model_timeout)
        return
    held = HeldDone(turn.sink)
    turn.sink = held
    try:
        await _sample(rollout, turn, step, model_timeout)
    finally:
        if turn.sink is held:
            turn.sink = held.inner
        trajectory = rollout.ctx.model_tokens
        fields = trajectory.last_step() if trajectory is not None else None
        step_ended(turn, step.first_new, fields, held)
    await held.flush()


async def _sample(
    rollout: RolloutCore, turn: Turn, step: SamplingStep, model_timeout: float
) -> None:
    step.opened = turn.stream.state is not ResponseState.NEW
    if turn.trace is not None:  # the upstream request carries it (OTEL-4)
        TRACEPARENT.set(turn.trace.traceparent)
    deltas = rollout.backend.stream(_request(rollout))
    seal = _step_seal(rollout, step)
    # try/finally, not ``contextlib.aclosing``: its three calls a step cost more than the close
    async with rollout.model_deadline.within(model_timeout):
        try:
            async for delta in deltas:
                if seal is not None and seal.hold(turn.stream, delta):
                    if isinstance(delta, Finish):  # the run is whole: seal it, then what waited
                        if not seal.cut_in_reasoning(delta):  # else it ends incomplete (ORD-8)
                            await _close_reasoning(turn, "completed", seal.blob(turn.stream, delta))
                        for held in seal.release():
                            await _emit(rollout, turn, step, held, seal)
                    continue
                if (
                    rollout.steering
                    and not step.calls
                    and step.opened
                    and not isinstance(delta, Finish)
                ):
                    # The sampling boundary (STEER-3): stop the generation here; nothing the client
                    # must answer has been produced yet (a finished call would be). A step that
                    # already finished completes, and the successor follows it.
                    step.reason = "steered"
                    rollout.accounting.count_finish(turn, step, Finish("stop", step.produced))
                    break
                if not step.opened:
                    step.clock.first_delta()
                    await rollout.open_turn(turn)
                    step.opened = True
                await _emit(rollout, turn, step, delta, seal)
        finally:
            await deltas.aclose()
    step.clock.finished()
    if not step.opened:
        await rollout.open_turn(turn)
    if step.reason not in ("length", "steered"):  # a cut-short item ends incomplete (ORD-8)
        await _close_message(turn, "completed")
        await _close_reasoning(turn, "completed", _blob(seal, turn.stream))
    # The model's own output joins the context (rendered once, never re-encoded); an MCP call
    # joins as its function-call form, its output after the step's own items (MCP-15).
    produced = turn.stream.output[step.first_new :]
    output = [call_form(item) for item in produced]
    rollout.pipeline.apply(rollout.ctx, output, path=OUTPUT, supports=frozenset({"text"}))
    join(rollout, rollout.hosted.take_outputs(), "mcp")
    if step.tokens is not None and rollout.settings.include_tokens:
        _report_tokens(turn.stream.response, step.tokens, produced)


def _report_tokens(
    response: Response, step: StepTokens, produced: Sequence[InputItem | OutputItem]
) -> None:
    """``include: ["rollout.token_ids"]``: the step's ids join the response (TOK-9)."""
    if isinstance(response.rollout_tokens, msgspec.UnsetType):
        response.rollout_tokens = RolloutTokens()
    response.rollout_tokens.samples.append(
        SampleTokens(
            prompt_tokens=step.prompt_tokens,
            prompt_token_ids=step.prompt_new,
            item_ids=[item_id for item in produced if (item_id := getattr(item, "id", None))],
            token_ids=step.sampled,
            logprobs=step.logprobs,
        )
    )


def _step_seal(rollout: RolloutCore, step: SamplingStep) -> StepSeal | None:
    """``include: ["reasoning.encrypted_content"]``: this step's sealing (SEAL-1, SEAL-3)."""
    if not rollout.settings.seal_reasoning:
        return None
    exact = rollout.backend.renders_own_tokens  # TOK-10
    engine, model = rollout.engine, rollout.settings.model
    return StepSeal(engine.reasoning_keys, rollout.owner, model, exact, step.first_new)


async def _emit(
    rollout: RolloutCore, turn: Turn, step: SamplingStep, delta: Delta, seal: StepSeal | None = None
) -> None:
    stream, send = turn.stream, turn.sink.send
    if isinstance(delta, TextDelta):
        step.produced += 1
        await _close_reasoning(turn, "completed", _blob(seal, stream))
        if not stream.has_open_item:
            for event in stream.add_message():
                await send(event)
        await send(stream.text_delta(delta.text))
    elif isinstance(delta, ReasoningDelta):
        step.produced += 1
        if not stream.reasoning_open:
            await _close_message(turn, "completed")
            for event in stream.add_reasoning():
                await send(event)
        await send(stream.reasoning_delta(delta.text))
    elif isinstance(delta, ArgsDelta):
        step.produced += 1
        if rollout.hosted.writing:
            await rollout.hosted.arguments(turn, delta.text)
        else:
            await send(stream.arguments_delta(delta.text))
    elif isinstance(delta, CallStart):
        await _close_message(turn, "completed")
        await _close_reasoning(turn, "completed", _blob(seal, stream))
        if rollout.hosted.claims(delta.name, delta.namespace):  # an MCP tool (MCP-7)
            await rollout.hosted.start(turn, delta.name)
        else:
            await send(
                stream.add_function_call(delta.name, delta.call_id, delta.namespace, delta.custom)
            )
    elif isinstance(delta, CallEnd) and rollout.hosted.writing:
        asked = await rollout.hosted.end(turn)
        if asked is not None:  # an approval request: the rollout waits for its answer (MCP-9)
            step.calls.append(asked)
    elif isinstance(delta, CallEnd):
        call, events = stream.finish_function_call()
        step.calls.append(call)
        for event in events:
            await send(event)
    elif isinstance(delta, Finish):
        step.reason, step.tokens = delta.reason, delta.tokens
        rollout.accounting.count_finish(turn, step, delta)


async def _close_message(turn: Turn, status: str) -> None:
    if turn.stream.has_open_item and not turn.stream.reasoning_open:
        for event in turn.stream.finish_message(status):
            await turn.sink.send(event)


def _blob(seal: StepSeal | None, stream: ResponseStream) -> str | None:
    return seal.blob(stream) if seal is not None else None


async def _close_reasoning(turn: Turn, status: str, blob: str | None = None) -> None:
    if turn.stream.reasoning_open:
        for event in turn.stream.finish_reasoning(status, blob):
            await turn.sink.send(event)


def _request(rollout: RolloutCore) -> SampleRequest:
    s = rollout.settings
    return SampleRequest(
        model=s.model,
        context=rollout.ctx,
        tools=rollout.hosted.offered(s.tools, rollout.ctx),  # MCP tools as functions (MCP-6)
        tool_choice=s.tool_choice,
        parallel_tool_calls=s.parallel_tool_calls,
        max_output_tokens=s.max_output_tokens,
        temperature=s.temperature,
        top_p=s.top_p,
    )
