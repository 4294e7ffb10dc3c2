"""THE coroutine: one agentic rollout (SPEC: ROLL-1..ROLL-8).

    prepare (pre-inference over the input, once)
    loop:  sample -> tool calls?  -> suspend on a Future -> resume with only the new items
    finish (post-inference, once, handed to the background worker)

The rollout owns its state (context, rendered tokens, pending calls, usage). Sessions talk to it
through ``offer`` (new items, validated and rendered incrementally, atomically) and ``retire``.
In append mode the whole rollout is one response (``response.done`` at each suspension); in
standard mode every sampling turn is its own response and the compat layer hands in a new
``Turn`` on resume.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import msgspec

from engine.accounting import RolloutFacts, UsageTally, safety_report, usage_record
from engine.benchclock import stage_delta
from engine.compaction import CompactRequest, compact, prune, rebuilt, worth_compacting
from engine.context import Context
from engine.core import Engine
from engine.history import TurnHistory, TurnRecord
from engine.models.base import (
    HOSTED_TOOLS,
    ArgsDelta,
    Backend,
    BackendError,
    CallEnd,
    CallStart,
    Finish,
    FinishReason,
    SampleRequest,
    StepTokens,
    TextDelta,
)
from engine.pipeline import FULL, INCREMENTAL, OUTPUT, ItemTexts, Pipeline, StageStats, TurnLog
from engine.post import UsageRecord
from engine.steer import Steer
from engine.store import ChainPoint, ResponseRecord, StoreError, chain_record, listing_form
from engine.store.errors import wire_error
from protocol import events as ev
from protocol.codec import error_event
from protocol.errors import InvalidRequest, ProtocolError
from protocol.items import InputItem, ToolCall, ToolOutput
from protocol.response import Response, RolloutTokens, SampleTokens
from protocol.states import TERMINAL_STATES, IllegalTransition, ResponseState
from protocol.stream import ResponseStream, new_id
from protocol.tools import ToolChoice, Toolset

log = logging.getLogger("rollout.rollout")


class ClientGone(Exception):
    """The peer went away while we were writing to it."""


class TurnNotStored(Exception):
    """A ``store: true`` response could not be stored: its terminal frame was replaced by an
    ``error`` (STORE-6, STORE-8) and the rollout ends."""


class Sink(Protocol):
    async def send(self, event: ev.ServerEvent) -> None: ...


SampleEnd = FinishReason | Literal["steered"]


class Mode(enum.Enum):
    STANDARD = "standard"  # compat: one response per sampling turn
    APPEND = "append"  # experimental: one response for the whole rollout


class Phase(enum.Enum):
    RUNNING = "running"
    SUSPENDED = "suspended"
    DONE = "done"


@dataclass
class Settings:
    """Sampling settings; in standard mode each continuation may change them."""

    model: str
    instructions: str | None
    tools: Toolset
    tool_choice: ToolChoice
    parallel_tool_calls: bool
    max_output_tokens: int | None
    store: bool
    temperature: float | None = None
    top_p: float | None = None
    compact_threshold: int | None = None  # context_management (COMPACT-3)
    include_tokens: bool = False  # ``include: ["rollout.token_ids"]`` (TOK-9)


def _future() -> asyncio.Future[str]:
    return asyncio.get_running_loop().create_future()


@dataclass
class Turn:
    """One response being produced: where its events go, its input, its own usage."""

    stream: ResponseStream
    sink: Sink
    input_items: list[InputItem]
    done: asyncio.Future[str] = field(default_factory=_future)
    tally: UsageTally = field(default_factory=UsageTally)
    log: TurnLog = field(default_factory=TurnLog)
    # Set before ``done`` resolves when steering continues the rollout in a new response.
    successor: Turn | None = None


def _now() -> int:
    return int(time.time())


class Rollout:
    def __init__(
        self,
        engine: Engine,
        backend: Backend,
        settings: Settings,
        turn: Turn,
        mode: Mode,
        context: Context | None = None,
    ) -> None:
        self.id = new_id("rollout")
        self.engine = engine
        self.backend = backend
        self.settings = settings
        self.turn = turn
        self.mode = mode
        self.ctx = context if context is not None else Context()
        self.stats = StageStats()
        estimate = getattr(backend, "renders_own_tokens", False)  # TOK-10
        self.pipeline = Pipeline(self.stats, engine.config.safety_policy, estimate)
        self.pipeline.log = turn.log
        self._reported_runs: Counter[str] = Counter()  # stage runs already in a ledger record
        self.phase = Phase.RUNNING
        self.pending: list[ToolCall] = []
        self.response_ids: list[str] = [turn.stream.id]
        self.resume_tokens: list[int] = []  # tokens rendered by each incremental offer
        self._wake: asyncio.Future[Turn | None] | None = None
        self._idle: asyncio.Timeout | None = None  # the idle limit of the current suspension
        self._fresh_tokens = 0  # tokens rendered from input since the last sample
        self._totals = UsageTally()  # usage over the whole rollout
        self._model_timeout = engine.config.model_timeout_s
        self.status = "in_progress"
        self.started_at = time.time()  # for the inspector (INSP-4)
        self.history = TurnHistory()  # the newest sampling steps, for the inspector (INSP-5)
        self.steers: list[Steer] = []  # accepted steering input, in submission order (STEER-2)
        # --bench-timings only (OBS-5); None otherwise, and then nothing below reads a clock.
        self._clock = engine.bench_clock
        self._ready_at = 0.0  # pre-inference's end: the rollout spawned or resumed
        self._prompt = (0, 0)  # the last sample's (prompt, freshly rendered) tokens
        self._logged: dict[str, float] = {}  # stage seconds already in a timing record
        self.owner: str | None = None  # the API key fingerprint its stored records carry

    # ================================================================== pre-inference
    def prepare(
        self,
        items: list[InputItem],
        texts: ItemTexts | None = None,
        *,
        path: str,
        history: list[InputItem] | None = None,
        stored: ChainPoint | None = None,
    ) -> None:
        """Pre-inference over the request's input: full history or only what is new (PIPE-1).

        ``history`` (a stored conversation) is processed first, so error ``param`` paths still
        index the request's own ``input``."""
        self._fresh_tokens += self._render_header(self.settings)
        if history:
            self._fresh_tokens += self.pipeline.apply(
                self.ctx, history, path=path, supports=self.backend.supports, param="history"
            )
            if stored is not None and len(self.ctx.items) == stored.length:
                self.ctx.stored = stored  # the next stored turn writes only what follows
        self._fresh_tokens += self.pipeline.apply(
            self.ctx, items, path=path, supports=self.backend.supports, texts=texts
        )
        if path == FULL:
            self._prune_compacted()
        missing = self.ctx.pending_calls()
        if missing:
            raise _missing_output(missing[0].call_id)
        if self._clock is not None:
            self._ready_at = time.perf_counter()

    def _render_header(self, s: Settings) -> int:
        """Instructions and tools; a forced hosted tool needs a backend that runs it (TOOL-5)."""
        runs_hosted = HOSTED_TOOLS in self.backend.supports
        return self.pipeline.render_header(
            self.ctx, s.instructions, s.tools, s.tool_choice, runs_hosted
        )

    def _prune_compacted(self) -> None:
        """A compaction item stands for what came before it (COMPACT-4): re-render without it.
        Runs after validation, so error paths still index the request's own input."""
        pruned = prune(self.ctx.items)
        if pruned is not None:
            self._replace_context(pruned)

    def _replace_context(self, items: list[InputItem]) -> None:
        """A fresh context holding ``items`` (a compacted window); nothing in it is cached."""
        self.ctx = rebuilt(self.pipeline, self.ctx, items, self.backend.supports)
        self._fresh_tokens = self.ctx.prompt_tokens

    async def _compact_if_needed(self, turn: Turn) -> None:
        """``context_management``: past the threshold, compact before sampling (COMPACT-3). The
        compaction item is the response's next output item; its cost joins the usage."""
        threshold = self.settings.compact_threshold
        if threshold is None or self.ctx.prompt_tokens <= threshold:
            return
        if not worth_compacting(self.ctx.items):
            return
        async with asyncio.timeout(self._model_timeout):  # an upstream compaction is a model call
            result = await compact(self.backend, CompactRequest(self.settings.model, self.ctx))
        self._replace_context(result.items)
        self.engine.counters["compaction.auto"] += 1
        for tally in (turn.tally, self._totals):
            tally.input_tokens += result.input_tokens
            tally.output_tokens += result.output_tokens
        await self._open_turn(turn)
        for event in turn.stream.add_compaction(result.item):
            await turn.sink.send(event)

    async def warm(self) -> None:
        """``generate: false``: state is prepared and the response completes with no output."""
        turn = self.turn
        self._count_prompt(turn)
        await turn.sink.send(turn.stream.created())
        with contextlib.suppress(TurnNotStored):  # the error frame has been sent
            await self._end_turn(turn, "completed")
        await self._end()

    def _require_outputs_for_pending(self, items: list[InputItem]) -> None:
        """Every function call must be answered before the model samples again (VAL-5)."""
        answered = {i.call_id for i in items if isinstance(i, ToolOutput)}
        for call in self.ctx.pending_calls():
            if call.call_id not in answered:
                raise _missing_output(call.call_id)

    # ================================================================== the coroutine
    async def run(self) -> None:
        """Task body. Owned by the session that started it."""
        try:
            await self._loop()
        except asyncio.CancelledError:
            await self._end(cancelled=True)  # never suspends: the task is being cancelled
            raise
        except ClientGone:
            await self._end(cancelled=True)
        except TurnNotStored:
            await self._end()
        except BackendError as exc:
            log.warning("rollout %s: backend failed: %s", self.id, exc)
            await self._fail_quietly(exc.protocol_error())
        except TimeoutError:
            log.warning("rollout %s: model exceeded %.0f s", self.id, self._model_timeout)
            await self._fail_quietly()
        except Exception:
            log.exception("rollout %s failed", self.id)
            await self._fail_quietly()
        finally:
            self.phase = Phase.DONE
            turn: Turn | None = self.turn
            while turn is not None:  # a successor that never began ends with it
                if not turn.done.done():
                    turn.done.set_result(self.status)
                turn = turn.successor

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
                else:
                    turn.stream.resume()
                    self._commit_steers_on_resume()
                continue
            # Accepted steering input continues the rollout in a successor response (STEER-3).
            successor = turn.successor = self._successor(turn) if self.steers else None
            if reason == "steered":
                await self._end_turn(turn, "incomplete", reason="steered")
            elif reason == "length":
                await self._end_turn(turn, "incomplete", reason="max_output_tokens")
            else:
                await self._end_turn(turn, "completed")
            if successor is None:
                break
            turn = self._begin_successor(successor)
        await self._end()

    async def _open_turn(self, turn: Turn) -> None:
        if turn.stream.state is ResponseState.NEW:
            await turn.sink.send(turn.stream.created())
            await turn.sink.send(turn.stream.in_progress())

    # ================================================================== sampling
    async def _sample(self, turn: Turn) -> tuple[list[ToolCall], SampleEnd]:
        await self._compact_if_needed(turn)
        started, output_before = time.time(), turn.tally.output_tokens
        prompt, cached = self._count_prompt(turn)
        turn.tally.samples += 1
        self._totals.samples += 1
        stream, send = turn.stream, turn.sink.send
        first_new = len(stream.output)
        calls: list[ToolCall] = []
        reason: SampleEnd = "stop"
        produced = 0  # deltas of this step, billed if steering cuts it short
        step_tokens: StepTokens | None = None
        request = self._sample_request()
        clock = _ModelClock(turn.log)
        if self._clock is not None and self._ready_at:
            turn.log.add_time("dispatch", clock.started - self._ready_at)
        deltas = self.backend.stream(request)
        # The response opens at the model's first delta, so a backend that refuses the request
        # (an upstream 4xx) yields a plain ``error`` and no response at all (MODEL-5).
        opened = turn.stream.state is not ResponseState.NEW
        async with asyncio.timeout(self._model_timeout), contextlib.aclosing(deltas):
            async for delta in deltas:
                if self.steers and not calls and opened and not isinstance(delta, Finish):
                    # The sampling boundary (STEER-3): stop the generation here; nothing the
                    # client must answer has been produced yet (a finished call would be). A
                    # step that already finished completes, and the successor follows it.
                    reason = "steered"
                    for tally in (turn.tally, self._totals):
                        tally.count_finish(Finish("stop", produced), prompt, cached)
                    break
                if not opened:
                    clock.first_delta()
                    await self._open_turn(turn)
                    opened = True
                if isinstance(delta, TextDelta):
                    produced += 1
                    if not stream.has_open_item:
                        for event in stream.add_message():
                            await send(event)
                    await send(stream.text_delta(delta.text))
                elif isinstance(delta, ArgsDelta):
                    produced += 1
                    await send(stream.arguments_delta(delta.text))
                elif isinstance(delta, CallStart):
                    await self._close_message(turn, "completed")
                    await send(
                        stream.add_function_call(
                            delta.name, delta.call_id, delta.namespace, delta.custom
                        )
                    )
                elif isinstance(delta, CallEnd):
                    call, events = stream.finish_function_call()
                    calls.append(call)
                    for event in events:
                        await send(event)
                elif isinstance(delta, Finish):
                    reason, step_tokens = delta.reason, delta.tokens
                    for tally in (turn.tally, self._totals):
                        tally.count_finish(delta, prompt, cached)
        clock.finished()
        if not opened:
            await self._open_turn(turn)
        if reason not in ("length", "steered"):  # a cut-short item ends incomplete (ORD-8)
            await self._close_message(turn, "completed")
        self._absorb_output(stream.output[first_new:])
        if step_tokens is not None and self.settings.include_tokens:
            _report_tokens(stream.response, step_tokens, stream.output[first_new:])
        turn.tally.tool_calls += len(calls)
        self._totals.tool_calls += len(calls)
        self._note_turn(turn, started, prompt - cached, prompt, output_before, calls, reason, clock)
        return calls, reason

    def _note_turn(
        self,
        turn: Turn,
        started: float,
        rendered: int,
        prompt: int,
        output_before: int,
        calls: list[ToolCall],
        reason: SampleEnd,
        clock: _ModelClock,
    ) -> None:
        """One record per sampling step into the bounded turn log (INSP-5)."""
        history = self.history
        history.add(
            TurnRecord(
                index=history.next_index(),
                response_id=turn.stream.id,
                started_at=started,
                rendered_tokens=rendered,
                prompt_tokens=prompt,
                output_tokens=turn.tally.output_tokens - output_before,
                calls=tuple(call.name for call in calls),
                finish="tool_calls" if calls else reason,
                pre_seconds=history.pre_seconds(turn.log),
                ttft_seconds=clock.ttft,
                model_seconds=clock.total,
            )
        )

    def _count_prompt(self, turn: Turn) -> tuple[int, int]:
        """The prompt a step reads (a sample, or a warmup's would-be sample) joins the response's
        and the rollout's usage; what was not rendered fresh since the last step counts as
        cached (USE-1, USE-2). Returns (prompt, cached) tokens."""
        prompt = self.ctx.prompt_tokens
        cached = max(prompt - self._fresh_tokens, 0)
        self._prompt = (prompt, prompt - cached)
        self._fresh_tokens = 0
        for tally in (turn.tally, self._totals):
            tally.count_prompt(prompt, cached)
        return prompt, cached

    def _sample_request(self) -> SampleRequest:
        s = self.settings
        return SampleRequest(
            model=s.model,
            context=self.ctx,
            tools=s.tools,
            tool_choice=s.tool_choice,
            parallel_tool_calls=s.parallel_tool_calls,
            max_output_tokens=s.max_output_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
        )

    async def _close_message(self, turn: Turn, status: str) -> None:
        if turn.stream.has_open_item:
            for event in turn.stream.finish_message(status):
                await turn.sink.send(event)

    def _absorb_output(self, items: Sequence[InputItem]) -> None:
        """The model's own output joins the context (rendered once, never re-encoded)."""
        self.pipeline.apply(self.ctx, list(items), path=OUTPUT, supports=frozenset({"text"}))

    # ================================================================== suspend / resume
    async def _suspend(self, turn: Turn, calls: list[ToolCall]) -> Turn | None:
        """Wait for tool outputs. Returns the turn to continue in, or None when retired."""
        self.pending = calls
        self.ctx.tokens.compact()  # it may wait a long time: hold only what it uses
        if self.ctx.model_tokens is not None:
            self.ctx.model_tokens.ids.compact()  # the same for the model's ids (TOK-7)
        loop = asyncio.get_running_loop()
        self._wake = loop.create_future()
        self.phase = Phase.SUSPENDED
        if self.mode is Mode.APPEND:
            await turn.sink.send(turn.stream.suspend(calls))
            self._time_turn(turn)
        else:
            await self._end_turn(turn, "completed")
        await self._notify_pending_steers(turn)
        try:
            async with asyncio.timeout(self.engine.config.suspended_idle_timeout_s) as idle:
                self._idle = idle
                next_turn = await self._wake
        except TimeoutError:
            next_turn = None
            if self.mode is Mode.APPEND:
                self.phase = Phase.RUNNING
                await self._end_turn(turn, "incomplete", reason="idle_timeout")
        finally:
            self._wake = self._idle = None
        if next_turn is not None:
            self.phase = Phase.RUNNING
            self.pending = []
            return next_turn
        # Retired or timed out: queued steering input was never committed (STEER-6).
        await self._fail_steers(turn, "response_not_active", "The response stopped waiting.")
        if self.mode is Mode.APPEND:
            await self._end(cancelled=True)  # retired by a closing connection: stored, accounted
        return None

    @property
    def idle_for(self) -> float | None:
        """Seconds on the current suspension's idle clock (ROLL-6), None when not suspended:
        a read-only view for the inspector (INSP-4)."""
        idle = self._idle
        deadline = idle.when() if idle is not None else None
        if deadline is None:
            return None
        start = deadline - self.engine.config.suspended_idle_timeout_s
        return max(asyncio.get_running_loop().time() - start, 0.0)

    @property
    def pending_calls(self) -> list[ToolCall]:
        """The calls a suspended rollout waits for, unanswered ones only (for observers)."""
        return self.ctx.pending_calls() if self.phase is Phase.SUSPENDED else []

    @property
    def waiting(self) -> bool:
        return self.phase is Phase.SUSPENDED and self._wake is not None and not self._wake.done()

    def offer(self, items: list[InputItem], texts: ItemTexts | None = None) -> bool:
        """Commit new items (incremental pre-inference). Raises ``InvalidRequest`` without any
        change when they are not acceptable. Returns True when every pending call is answered."""
        if not self.waiting:
            raise InvalidRequest(
                "response_not_waiting", "The response is not waiting for tool outputs.", None
            )
        rendered = self.pipeline.apply(
            self.ctx, items, path=INCREMENTAL, supports=self.backend.supports, texts=texts
        )
        self._fresh_tokens += rendered
        self.resume_tokens.append(rendered)
        if self._idle is not None:  # any accepted input restarts the idle clock (APPEND-6)
            limit = self.engine.config.suspended_idle_timeout_s
            self._idle.reschedule(asyncio.get_running_loop().time() + limit)
        return not self.ctx.pending_calls()

    def resume(self, turn: Turn, settings: Settings | None = None) -> None:
        """Wake the coroutine: in the same response (append) or in a new one (standard)."""
        if settings is not None:
            self._fresh_tokens += self._render_header(settings)
            self.settings = settings
        if turn is not self.turn:
            self.response_ids.append(turn.stream.id)
            _share_echoes(self.turn, turn)
        assert self._wake is not None
        self._wake.set_result(turn)
        if self._clock is not None:
            self._ready_at = time.perf_counter()

    def continue_standard(
        self, items: list[InputItem], texts: ItemTexts, turn: Turn, settings: Settings
    ) -> None:
        """Compat fast path: the new request answers the pending calls; resume in a new response."""
        if not self.waiting:
            raise InvalidRequest("response_not_waiting", "The response cannot be continued.", None)
        self._require_outputs_for_pending(items)
        previous_log, self.pipeline.log = self.pipeline.log, turn.log
        steered = [item for steer in self.steers for item in steer.items]
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
        self.steers = []
        turn.input_items = [*steered, *turn.input_items]
        self.resume(turn, settings)

    def retire(self) -> None:
        """End a suspended rollout without further sampling (evicted, replaced or closed)."""
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    # ================================================================== steering
    def steerable(self, response_id: str) -> bool:
        """Whether a steer naming ``response_id`` targets this rollout (STEER-1): it is the
        current response and it is sampling, or it waits for tool outputs."""
        if self.phase is Phase.DONE or self.turn.stream.id != response_id:
            return False
        return self.waiting or self.turn.stream.state not in TERMINAL_STATES

    def _successor(self, turn: Turn) -> Turn:
        """The response that continues a steered one: same settings, the steering input as its
        input, ``previous_response_id`` = the steered response (STEER-4)."""
        old = turn.stream.response
        response = msgspec.structs.replace(
            old,
            id=new_id("resp"),
            created_at=_now(),
            status="in_progress",
            completed_at=None,
            error=None,
            incomplete_details=None,
            output=[],
            usage=None,
            previous_response_id=old.id,
            safety=None,
        )
        items = [item for steer in self.steers for item in steer.items]
        return Turn(ResponseStream(response, turn.stream.stream_id), turn.sink, items)

    def _begin_successor(self, successor: Turn) -> Turn:
        self.steers = []
        self.turn = successor
        self.response_ids.append(successor.stream.id)
        self.pipeline.log = successor.log
        self._commit(successor.input_items)
        return successor

    def _commit_steers_on_resume(self) -> None:
        """Append mode: queued steering input joins the context after the tool outputs that
        woke the rollout, and the same response samples again (STEER-5)."""
        if self.steers:
            steered = [item for steer in self.steers for item in steer.items]
            self.steers = []
            self._commit(steered)

    def _commit(self, items: list[InputItem]) -> None:
        self._fresh_tokens += self.pipeline.apply(
            self.ctx, items, path=INCREMENTAL, supports=self.backend.supports, param="steer"
        )

    async def _notify_pending_steers(self, turn: Turn) -> None:
        """``response.steer.pending``, after the response stopped for tool outputs (STEER-5)."""
        for steer in self.steers:
            if not steer.notified:
                steer.notified = True
                calls = self.ctx.pending_calls()
                await turn.sink.send(turn.stream.steer_pending(steer.id, calls))

    async def _fail_steers(self, turn: Turn, code: str, message: str) -> None:
        """Return every uncommitted steer's input (STEER-6); a closed socket hears nothing."""
        steers, self.steers = self.steers, []
        with contextlib.suppress(ClientGone, IllegalTransition):
            for steer in steers:
                await turn.sink.send(turn.stream.steer_failed(steer.ref(), code, message))

    # ================================================================== endings
    async def _end_turn(self, turn: Turn, status: str, reason: str | None = None) -> None:
        """The response's terminal frame; in standard mode also its ledger record (POST-1)."""
        stream, now = turn.stream, _now()
        stream.response.safety = safety_report(self.pipeline.policy, turn.log.findings)
        if status == "completed":
            event: ev.ServerEvent = stream.completed(turn.tally.usage(), now)
        elif status == "incomplete":
            event = stream.incomplete(reason or "max_output_tokens", turn.tally.usage(), now)
        else:
            event = stream.failed(
                "server_error", "The model failed to generate a response.", turn.tally.usage(), now
            )
        self.status = status
        try:
            await self._store(turn)  # durable before the terminal frame (STORE-6)
        except StoreError as exc:
            await self._unstored(turn, exc)
            raise TurnNotStored from exc
        try:
            await turn.sink.send(event)
        finally:
            if not turn.done.done():
                turn.done.set_result(status)
        self._time_turn(turn)
        if self.mode is Mode.STANDARD:
            await self.engine.post.submit(self._record([stream.id], turn.tally, turn.log))

    def _time_turn(self, turn: Turn) -> None:
        """Under --bench-timings: this turn's stage timings from the server's clocks (OBS-5)."""
        if self._clock is None:
            return
        seconds = turn.log.seconds
        stages = stage_delta(seconds, self._logged) if self.mode is Mode.APPEND else seconds
        self._logged = dict(seconds)
        samples = self._totals.samples if self.mode is Mode.APPEND else 1
        tokens = (*self._prompt, self.ctx.prompt_tokens)
        self._clock.turn(turn.stream.id, samples, dict(stages), turn.sink, tokens)
        self._ready_at = 0.0

    async def _store(self, turn: Turn) -> None:
        if not self.settings.store:
            return
        record = self._stored_record(turn)
        start = time.perf_counter()
        await self.engine.store.put(record)
        turn.log.add_time("store", time.perf_counter() - start)  # OBS-1
        self.ctx.stored = record.point
        if record.tokens is not None and self.ctx.model_tokens is not None:
            self.ctx.model_tokens.mark_stored()

    def _stored_record(self, turn: Turn) -> ResponseRecord:
        """Flat: this response's own input, output and new context items (STORE-4), and the
        token trajectory's new part (TOK-8)."""
        record = chain_record(
            turn.stream.response,
            [listing_form(item) for item in turn.input_items],
            self.ctx.items,
            self.ctx.stored,
            owner=self.owner,
        )
        trajectory = self.ctx.model_tokens
        if trajectory is not None and trajectory.covered == len(self.ctx.items):
            record.tokens = trajectory.segment(snapshot=not record.links)
        return record

    async def _unstored(self, turn: Turn, exc: StoreError) -> None:
        """The store did not acknowledge: the client gets an ``error`` instead of the terminal
        frame, so it never holds an id it cannot continue (STORE-8). Usage is still billed."""
        log.warning("rollout %s: response %s not stored: %s", self.id, turn.stream.id, exc)
        self.status = "failed"
        turn.successor = None  # a steered response's successor never begins (STEER-3)
        if self.mode is Mode.STANDARD:
            self.engine.post.submit_nowait(self._record([turn.stream.id], turn.tally, turn.log))
        try:
            await turn.sink.send(error_event(wire_error(exc), stream_id=turn.stream.stream_id))
        except ClientGone:
            pass
        finally:
            if not turn.done.done():
                turn.done.set_result("failed")

    async def _fail_quietly(self, refusal: ProtocolError | None = None) -> None:
        """A backend's refusal before the response opened is an ``error`` with the backend's
        status and no response (MODEL-5); any other fault is a generic ``response.failed``
        (ERR-3)."""
        turn = self.turn
        with contextlib.suppress(Exception):
            if turn.stream.state is ResponseState.NEW and refusal is not None:
                await turn.sink.send(error_event(refusal, stream_id=turn.stream.stream_id))
            elif turn.stream.state not in TERMINAL_STATES:
                await self._open_turn(turn)
                await self._end_turn(turn, "failed")
        self.status = "failed"
        await self._fail_steers(turn, "response_not_active", "The response failed.")
        await self._end()

    async def _end(self, *, cancelled: bool = False) -> None:
        """The one ending of a rollout, run once: its stage counters join the engine's and the
        ledger record still owed is handed to post-inference (POST-1): the rollout's one
        response in append mode, an open response in standard mode.

        ``cancelled``: the task was cancelled, the client left, or a suspended append rollout
        was retired. A response still open is stored as ``cancelled`` and billed, and the record
        is handed over without waiting, so a cancelled task never suspends here."""
        turn = self.turn
        billed_open = cancelled and turn.stream.state not in TERMINAL_STATES
        if billed_open:
            turn.stream.response.status = "cancelled"
            turn.stream.response.completed_at = _now()
            # What it used is reported and billed (ROLL-7, BG-6).
            tally = self._totals if self.mode is Mode.APPEND else turn.tally
            turn.stream.response.usage = tally.usage()
            if self.settings.store:  # nobody waits for this one: written in the background
                self.engine.store_later(self._stored_record(turn))
            self.status = "cancelled"
        if self.phase is Phase.DONE:
            return
        self.phase = Phase.DONE
        self.engine.stats.add(self.stats)
        if self.mode is Mode.APPEND:
            record = self._record(self.response_ids, self._totals, turn.log)
        elif billed_open:
            record = self._record([turn.stream.id], turn.tally, turn.log)
        else:
            return
        if cancelled:
            self.engine.post.submit_nowait(record)
        else:
            await self.engine.post.submit(record)

    def _record(self, response_ids: list[str], tally: UsageTally, log: TurnLog) -> UsageRecord:
        runs = self.stats.runs - self._reported_runs
        self._reported_runs = Counter(self.stats.runs)
        facts = RolloutFacts(
            rollout_id=self.id,
            mode=self.mode.value,
            model=self.settings.model,
            status=self.status,
            stage_tokens=self.stats.tokens,
            resume_tokens=self.resume_tokens,
        )
        return usage_record(facts, response_ids, tally, log, dict(runs))


class _ModelClock:
    """Time to first delta and total model time of one sampling step, into the turn's log."""

    __slots__ = ("_log", "_start", "total", "ttft")

    def __init__(self, log: TurnLog) -> None:
        self._log = log
        self._start = time.perf_counter()
        self.ttft: float | None = None
        self.total = 0.0

    @property
    def started(self) -> float:
        return self._start

    def first_delta(self) -> None:
        if self.ttft is None:
            self.ttft = time.perf_counter() - self._start
            self._log.add_time("ttft", self.ttft)

    def finished(self) -> None:
        self.total = time.perf_counter() - self._start
        self._log.add_time("model", self.total)


def _report_tokens(response: Response, step: StepTokens, produced: Sequence[InputItem]) -> None:
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


def _share_echoes(previous: Turn, turn: Turn) -> None:
    """A continuation that resends the previous turn's very instructions and tools (the raw
    bytes, TOOL-1: byte-equal, so the echo is unchanged) echoes the previous objects, whose JSON
    is encoded once per object (CODEC-6) and reused by every snapshot of every turn instead of
    being encoded again (~15 KB of instructions for a Codex-sized request)."""
    old, new = previous.stream.response, turn.stream.response
    if new.instructions == old.instructions:
        new.instructions = old.instructions
    if new.tools == old.tools:
        new.tools = old.tools


def _missing_output(call_id: str) -> InvalidRequest:
    return InvalidRequest(
        "tool_output_missing", f"No tool output found for function call {call_id}.", "input"
    )


__all__ = [
    "FULL",
    "INCREMENTAL",
    "ClientGone",
    "Mode",
    "Phase",
    "Rollout",
    "Settings",
    "Sink",
    "Turn",
]
