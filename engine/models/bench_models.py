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
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from functools import lru_cache

from engine.models.base import Backend, Delta, Finish, SampleRequest, TextDelta
from engine.models.router import Router, simulator_router
from engine.models.scenarios import CODING_AGENT_FINAL, CODING_AGENT_STEPS
from engine.models.sim import Plan, PlannedCall, SimulatedModel, _Pacer, token_pieces
from protocol.items import FunctionCallOutput

CODING_PREFIX = "bench-coding-agent/"
TEXT_PREFIX = "bench-text/"
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
        done = sum(1 for item in request.context.items if isinstance(item, FunctionCallOutput))
        if done >= self.calls:
            return Plan(CODING_AGENT_FINAL, [])
        step = CODING_AGENT_STEPS[done % len(CODING_AGENT_STEPS)]
        return Plan(None, [PlannedCall(step.name, step.arguments_json())])


@lru_cache(maxsize=1)
def _prose_deltas() -> tuple[TextDelta, ...]:
    """One-token deltas of a paragraph of prose, built once; answers cycle through them, so
    no answer length costs anything to prepare (the first token is never delayed by setup)."""
    return tuple(TextDelta(piece) for piece in token_pieces(_PROSE))


class LongTextModel:
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


class BenchModels:
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
        if model.startswith(TEXT_PREFIX):
            return LongTextModel(self.tokens_per_second, _count(model, TEXT_PREFIX))
        return self.fallback


@lru_cache(maxsize=64)
def _looping(tokens_per_second: float, calls: int) -> LoopingCodingAgent:
    return LoopingCodingAgent(tokens_per_second, calls)


def _count(model: str, prefix: str) -> int:
    """The number after the prefix; a malformed name falls back to 1 (never an exception)."""
    digits = model[len(prefix) :]
    return int(digits) if digits.isdigit() else 1
