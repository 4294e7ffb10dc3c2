"""The bundled coding-agent scenario, client side: a real sandbox and its real tools.

Tool outputs come from ``clients.coding`` working on real files (directory listings, 1-4 KB
source files, pytest-style reports), so the history grows the way an agent's does. Tool time is
measured and kept out of the server-overhead figures.

Longer runs (``--turns`` above the script's 26 calls) loop the script; each loop starts on a
fresh copy of the project (the previous loop fixed every bug), so every loop's outputs are as
realistic as the first. ``history_scale`` K > 1 makes each tool output K times longer (K copies,
each headed with its copy number): an explicit, documented inflation for studying history size,
never on by default.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from clients.coding import (
    SCENARIO_INSTRUCTIONS,
    SCENARIO_PROMPT,
    SCENARIO_TOOL_CALLS,
    coding_tools,
    make_sandbox,
)
from clients.toolbox import ToolRegistry

SCRIPT_CALLS = SCENARIO_TOOL_CALLS  # 26: the server's scripted coding agent (SIM-4)
CODING_PREFIX = "bench-coding-agent/"
TEXT_PREFIX = "bench-text/"


def coding_model(calls: int) -> str:
    """The model name that makes a ``rollout serve --bench-models`` server script ``calls``
    tool calls (the coding-agent script, looped; SPEC: BENCH-1)."""
    return f"{CODING_PREFIX}{calls}"


def text_model(tokens: int) -> str:
    """The model name that makes a ``--bench-models`` server stream a ``tokens``-token answer."""
    return f"{TEXT_PREFIX}{tokens}"


@dataclass(frozen=True, slots=True)
class Call:
    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class ToolResult:
    call_id: str
    output: str
    seconds: float

    def item(self) -> dict[str, Any]:
        return {"type": "function_call_output", "call_id": self.call_id, "output": self.output}


class ScenarioTools:
    """The scenario's tools on a temporary sandbox, re-created per run and per script loop."""

    def __init__(self, history_scale: int = 1, tool_latency_s: float = 0.0) -> None:
        self.history_scale = max(1, history_scale)
        self.tool_latency_s = tool_latency_s
        self.calls = 0
        self._dir: Path | None = None
        self._tools: ToolRegistry | None = None

    async def __aenter__(self) -> Self:
        self._dir = Path(tempfile.mkdtemp(prefix="rollout-bench-"))
        self._reset()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    def _reset(self) -> None:
        assert self._dir is not None
        root = self._dir / "project"
        shutil.rmtree(root, ignore_errors=True)
        self._tools = coding_tools(make_sandbox(root))

    def definitions(self) -> list[dict[str, Any]]:
        assert self._tools is not None
        return self._tools.definitions()

    def first_request(self, model: str) -> dict[str, Any]:
        return first_request(model, self.definitions())

    async def run(self, calls: list[Call]) -> list[ToolResult]:
        """Run one turn's calls (concurrently, results in call order)."""
        return list(await asyncio.gather(*(self._one(call) for call in calls)))

    async def _one(self, call: Call) -> ToolResult:
        start = time.perf_counter()
        if self.calls and self.calls % SCRIPT_CALLS == 0:
            self._reset()  # the next loop of the script works on a fresh project
        self.calls += 1
        assert self._tools is not None
        outcome = await self._tools.execute(call.name, call.arguments)
        output = scale_output(outcome.output, self.history_scale)
        if self.tool_latency_s > 0:
            await asyncio.sleep(self.tool_latency_s)  # opt-in simulated tool time (client side)
        return ToolResult(call.call_id, output, time.perf_counter() - start)


def scale_output(output: str, scale: int) -> str:
    """``scale`` copies of a tool output, each headed by its copy number (K=1: unchanged)."""
    if scale <= 1:
        return output
    return "\n".join(f"[copy {i + 1}/{scale}]\n{output}" for i in range(scale))


def first_request(model: str, tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The scenario's opening create body (every mode adds its own transport fields)."""
    return {
        "model": model,
        "instructions": SCENARIO_INSTRUCTIONS,
        "input": [{"type": "message", "role": "user", "content": SCENARIO_PROMPT}],
        "tools": tools,
    }
