"""A scripted backend for tests and demos (MODEL-4): replays given turns, fails loudly otherwise.

Each turn is a list of deltas (or an exception instance to raise mid-stream, after the deltas
before it, a float to pause that many seconds, or an ``asyncio.Event`` to wait for: a gate the
test opens when it has seen what it needs). Calling it more times than scripted raises, so a test
can never pass by accident.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence

from engine.models.base import Backend, Delta, Finish, SampleRequest

# A float pauses that many seconds (to test cancellation); an Event holds the stream until set.
ScriptStep = Delta | BaseException | float | asyncio.Event


class ScriptedModel(Backend):
    name = "scripted"
    supports = frozenset({"text", "image", "file"})

    def __init__(self, turns: Sequence[Sequence[ScriptStep]]) -> None:
        self.turns = [list(t) for t in turns]
        self.requests: list[SampleRequest] = []

    async def stream(self, request: SampleRequest) -> AsyncGenerator[Delta, None]:
        if len(self.requests) >= len(self.turns):
            raise AssertionError(f"unexpected sampling call #{len(self.requests) + 1}")
        steps = self.turns[len(self.requests)]
        self.requests.append(request)
        for step in steps:
            if isinstance(step, BaseException):
                raise step
            if isinstance(step, float):
                await asyncio.sleep(step)
                continue
            if isinstance(step, asyncio.Event):
                await step.wait()
                continue
            yield step
        if not steps or not isinstance(steps[-1], Finish):
            yield Finish("stop", 0)
