"""Bench-only models, routed in by ``rollout serve --bench-models`` (the server the benchmark,
``clients/bench``, starts as a subprocess).

Why they exist: the stock scripted agent stops after its 26 calls and the simulator's text
answers are a sentence long, so neither can grow a history to 100 turns nor stream for seconds.
Both models below reuse the simulator's code (``SimulatedModel`` and its deadline ``_Pacer``),
so their timing is exactly the simulator's: the pacing is the only simulated time.

Model names (anything else goes to the plain simulator):

* ``bench-coding-agent/N``: the coding-agent script, looped until N tool calls were made, then
  the scenario's final answer. ``N <= 26`` is the stock script cut at N calls.
* ``bench-text/N``: a text answer of exactly N tokens (no tools).
* ``bench-codex/N``: a Codex-shaped agent (``clients/bench/suites/codex.py`` holds its tools
  and their generated outputs): a fixed cycle of calls of about 30 argument tokens each over the
  Codex tool names, until N calls were made, then a short answer.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from functools import lru_cache

from engine.models.base import Backend, Delta, Finish, SampleRequest, TextDelta
from engine.models.router import Router, simulator_router
from engine.models.sim.scenarios import CODING_AGENT_FINAL, CODING_AGENT_STEPS
from engine.models.sim.simulator import Plan, PlannedCall, SimulatedModel, _Pacer, token_pieces

CODING_PREFIX = "bench-coding-agent/"
TEXT_PREFIX = "bench-text/"
CODEX_PREFIX = "bench-codex/"
_PROSE = (
    "The rollout engine keeps each agent's conversation inside one suspended coroutine, so "
    "every tool result it receives costs only the work needed for the new tokens. "
)


def coding_model(calls: int) -> str:
    """The model name that makes the bench server script ``calls`` tool calls."""
    return f"{CODING_PREFIX}{calls}"


def text_model(tokens: int) -> str:
    """The model name that makes the bench server stream a ``tokens``-token answer."""
    return f"{TEXT_PREFIX}{tokens}"


class LoopingCodingAgent(SimulatedModel):
    """The coding-agent script, repeated from its first step until ``calls`` calls were made.

    The step is derived from the conversation (tool outputs so far), as in the stock scenario, so
    every transport that carries the same history gets the same next call."""

    def __init__(self, tokens_per_second: float, calls: int) -> None:
        super().__init__(tokens_per_second, scenario="coding-agent")
        self.calls = calls

    def plan(self, request: SampleRequest) -> Plan:
        done = len(request.context.answered)  # tool outputs so far, O(1) (not a history scan)
        if done >= self.calls:
            return Plan(CODING_AGENT_FINAL, [])
        step = CODING_AGENT_STEPS[done % len(CODING_AGENT_STEPS)]
        return Plan(None, [PlannedCall(step.name, step.arguments_json())])


# The codex scenario's call cycle: (tool, arguments). The client defines these tools (nested
# schemas) and generates their outputs; ``tests/bench`` checks both sides use the same names.
CODEX_STEPS: tuple[tuple[str, dict[str, object]], ...] = (
    ("list_dir", {"path": "src/engine", "depth": 2, "options": {"hidden": False}}),
    ("read_file", {"path": "src/engine/scheduler.rs", "range": {"start": 1, "end": 400}}),
    ("grep_files", {"pattern": "fn dispatch_", "paths": ["src"], "options": {"context": 3}}),
    ("shell", {"command": ["bash", "-lc", "cargo check -p engine"], "timeout_ms": 120000}),
    ("read_file", {"path": "src/engine/queue.rs", "range": {"start": 120, "end": 520}}),
    ("update_plan", {"plan": [{"step": "fix dispatch ordering", "status": "in_progress"}]}),
    ("apply_patch", {"patch": "*** Begin Patch\n*** Update File: src/engine/queue.rs\n"}),
    ("run_tests", {"target": "engine", "filters": {"name": "dispatch"}, "jobs": 2}),
    ("git", {"subcommand": "diff", "args": ["--stat"], "options": {"color": False}}),
    ("search_symbols", {"query": "Dispatcher", "kinds": ["struct", "impl"], "limit": 20}),
    ("view_logs", {"source": "test-run", "filter": {"level": "warn", "since_s": 60}}),
    ("web_search", {"query": "tokio select biased ordering", "options": {"max_results": 5}}),
)
CODEX_FINAL = "The dispatcher now drains the queue in order; every test passes."


class CodexAgent(SimulatedModel):
    """Cycles ``CODEX_STEPS`` until ``calls`` calls were made; the step index is the number of
    tool outputs in the conversation, so every transport gets the same next call."""

    def __init__(self, tokens_per_second: float, calls: int) -> None:
        super().__init__(tokens_per_second)
        self.calls = calls
        self._arguments = [json.dumps(args, separators=(",", ":")) for _, args in CODEX_STEPS]

    def plan(self, request: SampleRequest) -> Plan:
        done = len(request.context.answered)  # tool outputs so far, O(1) (not a history scan)
        if done >= self.calls:
            return Plan(CODEX_FINAL, [])
        step = done % len(CODEX_STEPS)
        return Plan(None, [PlannedCall(CODEX_STEPS[step][0], self._arguments[step])])


@lru_cache(maxsize=1)
def _prose_deltas() -> tuple[TextDelta, ...]:
    """One-token deltas of a paragraph of prose, built once; answers cycle through them, so
    no answer length costs anything to prepare (the first token is never delayed by setup)."""
    return tuple(TextDelta(piece) for piece in token_pieces(_PROSE))


class LongTextModel(Backend):
    """Streams a text answer of a fixed number of tokens at the simulator's pacing."""

    name = "bench-text"
    supports = frozenset({"text"})

    def __init__(self, tokens_per_second: float, tokens: int) -> None:
        self.tokens_per_second = tokens_per_second
        self.tokens = tokens

    async def stream(self, request: SampleRequest) -> AsyncGenerator[Delta, None]:
        deltas = _prose_deltas()
        cycle = len(deltas)
        pacer = _Pacer(self.tokens_per_second)
        for produced in range(self.tokens):
            await pacer.tick(produced)
            yield deltas[produced % cycle]
        yield Finish("stop", self.tokens)


def bench_router(tokens_per_second: float) -> Router:
    """The simulator's routes (``sim``, ``sim-coding-agent``) with the bench models as the
    default route (SPEC: BENCH-1): any other name still reaches the plain simulator."""
    router = simulator_router(tokens_per_second)
    router.default = BenchModels(tokens_per_second)
    return router


class BenchModels(Backend):
    """The bench server's default route: picks a bench model from the requested name.

    ``stream`` returns the chosen model's generator itself, so dispatch adds no per-delta cost."""

    name = "bench"
    supports = frozenset({"text", "image"})

    def __init__(self, tokens_per_second: float) -> None:
        self.tokens_per_second = tokens_per_second
        self.fallback = SimulatedModel(tokens_per_second)

    def stream(self, request: SampleRequest) -> AsyncGenerator[Delta, None]:
        return self.pick(request.model).stream(request)

    def pick(self, model: str) -> Backend:
        if model.startswith(CODING_PREFIX):
            return _looping(self.tokens_per_second, _count(model, CODING_PREFIX))
        if model.startswith(CODEX_PREFIX):
            return _codex(self.tokens_per_second, _count(model, CODEX_PREFIX))
        if model.startswith(TEXT_PREFIX):
            return LongTextModel(self.tokens_per_second, _count(model, TEXT_PREFIX))
        return self.fallback


@lru_cache(maxsize=64)
def _looping(tokens_per_second: float, calls: int) -> LoopingCodingAgent:
    return LoopingCodingAgent(tokens_per_second, calls)


@lru_cache(maxsize=64)
def _codex(tokens_per_second: float, calls: int) -> CodexAgent:
    return CodexAgent(tokens_per_second, calls)


def _count(model: str, prefix: str) -> int:
    """The number after the prefix; a malformed name falls back to 1 (never an exception)."""
    digits = model[len(prefix) :]
    return int(digits) if digits.isdigit() else 1
