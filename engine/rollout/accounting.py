"""A rollout's books (SPEC: USE-1..USE-3, POST-1..POST-3, OBS-1, OBS-5, INSP-5).

One object keeps what a rollout counts: both usage tallies (the current response's, on its
``Turn``, and the rollout's totals, added side by side in one place), what pre-inference
rendered fresh since the last sampling step (so the rest counts as cached), the stage counters,
the ``--bench-timings`` clocks, the inspector's turn history, and the ledger records it makes.
The rollout tells it what happened; it never decides anything about the rollout.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from engine.conversation.pipeline import StageStats, TurnLog
from engine.models.base import Finish, StepTokens
from engine.observe.accounting import RolloutFacts, UsageTally, usage_record
from engine.observe.benchclock import BenchClock, stage_delta
from engine.observe.postinference import UsageRecord
from engine.observe.turnlog import TurnHistory, TurnRecord
from engine.rollout.turn import Mode, SampleEnd, Turn
from protocol.items import ToolCall


class ModelClock:
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


@dataclass
class SamplingStep:
    """One sampling step as it runs: what it read, what it produced, how it ended."""

    prompt: int  # prompt tokens it read
    cached: int  # of which not rendered fresh for it
    clock: ModelClock
    first_new: int  # index of its first output item in the response
    output_before: int  # the response's output tokens before it
    started: float = field(default_factory=time.time)
    calls: list[ToolCall] = field(default_factory=list)
    reason: SampleEnd = "stop"
    produced: int = 0  # deltas so far, billed if steering cuts the step short (STEER-3)
    opened: bool = False  # the response is open on the wire
    tokens: StepTokens | None = None  # a tokens backend's ids and logprobs (TOK-9)


class Accounting:
    def __init__(self, rollout_id: str, mode: Mode, clock: BenchClock | None) -> None:
        self.rollout_id = rollout_id
        self.mode = mode
        self.totals = UsageTally()  # usage over the whole rollout
        self.stats = StageStats()  # pre-inference runs and rendered tokens (the pipeline's)
        self.history = TurnHistory()  # the newest sampling steps, for the inspector (INSP-5)
        self.resume_tokens: list[int] = []  # tokens rendered by each incremental offer
        self._fresh = 0  # tokens rendered from input since the last sample
        self._reported_runs: dict[str, int] = {}  # stage runs already in a record
        self._reported_resumes = 0  # resume_tokens entries already in a record
        # --bench-timings only (OBS-5); None otherwise, and then nothing below reads a clock.
        self._clock = clock
        self._ready_at = 0.0  # pre-inference's end: the rollout spawned or resumed
        self._prompt = (0, 0)  # the last sample's (prompt, freshly rendered) tokens
        self._logged: dict[str, float] = {}  # stage seconds already in a timing record

    # ------------------------------------------------------------------ pre-inference
    def rendered(self, tokens: int) -> None:
        """Pre-inference rendered ``tokens`` fresh for the next step."""
        self._fresh += tokens

    def offered(self, tokens: int) -> None:
        """An incremental offer rendered ``tokens`` (already counted as ``rendered``; POST-3
        ``resume_tokens``)."""
        self.resume_tokens.append(tokens)

    def rerendered(self, tokens: int) -> None:
        """The context was rebuilt (a compacted window): nothing of it is cached."""
        self._fresh = tokens

    def ready(self) -> None:
        """Pre-inference ended: the rollout spawns or wakes (the bench's ``dispatch`` start)."""
        if self._clock is not None:
            self._ready_at = time.perf_counter()

    # ------------------------------------------------------------------ sampling
    def count_prompt(self, turn: Turn, prompt: int) -> tuple[int, int]:
        """The prompt a step reads (a sample, or a warmup's would-be sample) joins the
        response's and the rollout's usage; what was not rendered fresh since the last step
        counts as cached (USE-1, USE-2). Returns (prompt, cached) tokens."""
        cached = max(prompt - self._fresh, 0)
        self._prompt = (prompt, prompt - cached)
        self._fresh = 0
        for tally in (turn.tally, self.totals):
            tally.count_prompt(prompt, cached)
        return prompt, cached

    def begin_step(self, turn: Turn, prompt: int) -> SamplingStep:
        output_before = turn.tally.output_tokens
        prompt, cached = self.count_prompt(turn, prompt)
        turn.tally.samples += 1
        self.totals.samples += 1
        clock = ModelClock(turn.log)
        if self._clock is not None and self._ready_at:
            turn.log.add_time("dispatch", clock.started - self._ready_at)
        return SamplingStep(prompt, cached, clock, len(turn.stream.output), output_before)

    def count_finish(self, turn: Turn, step: SamplingStep, finish: Finish) -> None:
        for tally in (turn.tally, self.totals):
            tally.count_finish(finish, step.prompt, step.cached)

    def count_compaction(self, turn: Turn, input_tokens: int, output_tokens: int) -> None:
        """A compaction's own cost joins the usage (COMPACT-3)."""
        for tally in (turn.tally, self.totals):
            tally.input_tokens += input_tokens
            tally.output_tokens += output_tokens

    def end_step(self, turn: Turn, step: SamplingStep) -> None:
        """The step's calls join the counts and it becomes one record of the bounded turn log
        (INSP-5)."""
        turn.tally.tool_calls += len(step.calls)
        self.totals.tool_calls += len(step.calls)
        history = self.history
        history.add(
            TurnRecord(
                index=history.next_index(),
                response_id=turn.stream.id,
                started_at=step.started,
                rendered_tokens=step.prompt - step.cached,
                prompt_tokens=step.prompt,
                output_tokens=turn.tally.output_tokens - step.output_before,
                calls=tuple(call.name for call in step.calls),
                finish="tool_calls" if step.calls else step.reason,
                pre_seconds=history.pre_seconds(turn.log),
                ttft_seconds=step.clock.ttft,
                model_seconds=step.clock.total,
            )
        )

    # ------------------------------------------------------------------ endings
    def time_turn(self, turn: Turn, context_tokens: int) -> None:
        """Under --bench-timings: this turn's stage timings from the server's clocks (OBS-5)."""
        if self._clock is None:
            return
        seconds = turn.log.seconds
        append = self.mode is Mode.APPEND
        stages = stage_delta(seconds, self._logged) if append else seconds
        self._logged = dict(seconds)
        samples = self.totals.samples if append else 1
        tokens = (*self._prompt, context_tokens)
        self._clock.turn(turn.stream.id, samples, dict(stages), turn.sink, tokens)
        self._ready_at = 0.0

    def record(
        self, model: str, status: str, response_ids: list[str], tally: UsageTally, log: TurnLog
    ) -> UsageRecord:
        """A ledger record (POST-3); its stage runs are those since the previous record."""
        reported, current = self._reported_runs, self.stats.runs
        runs = {k: n - reported.get(k, 0) for k, n in current.items() if n > reported.get(k, 0)}
        self._reported_runs = dict(current)
        # Each record carries the offers since the last one (POST-3): a standard-mode rollout
        # bills every turn, and a record holding the whole history would grow the ledger O(n^2).
        resumes = self.resume_tokens[self._reported_resumes :]
        self._reported_resumes = len(self.resume_tokens)
        facts = RolloutFacts(
            rollout_id=self.rollout_id,
            mode=self.mode.value,
            model=model,
            status=status,
            stage_tokens=self.stats.tokens,
            resume_tokens=resumes,
        )
        return usage_record(facts, response_ids, tally, log, runs)
