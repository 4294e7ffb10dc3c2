"""The scenario benchmark: for each speed, one server, then every mode (R times, rotated).

Rotating the mode order between repeats spreads any drift of this shared machine (other
processes, thermal state) over all modes instead of always penalising the one that runs last.
A short warm-up rollout per mode (2 tool calls) runs first on each server, so no mode pays for
first-use costs (imports, the tokenizer's caches) in its figures.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from clients.bench.measure import RunResult, RunSettings, run_mode
from clients.bench.proc import ServerProcess
from clients.bench.progress import RunProgress
from clients.bench.report import combine
from clients.bench.scenario import SCRIPT_CALLS, coding_model
from clients.bench.suites.codex import codex_model
from clients.bench.suites.stores import store_url
from clients.bench.transports import MODES

STOCK_MODEL = "sim-coding-agent"


@dataclass
class ScenarioConfig:
    speeds: list[float] = field(default_factory=lambda: [65.0, 1000.0, 4000.0])
    modes: list[str] = field(default_factory=lambda: list(MODES))
    tool_calls: int = SCRIPT_CALLS
    history_scale: int = 1
    tool_latency_s: float = 0.0
    repeat: int = 1
    url: str | None = None
    scenario: str = "coding"  # or "codex"
    store: str = "memory"  # --store: memory, sqlite, redis, postgres or a URL (BENCH-6)
    otel_endpoint: str | None = None  # the server exports traces there (OTEL-1): their cost

    @property
    def model(self) -> str:
        """The stock scripted agent for the stock 26 calls; the bench's looping one otherwise."""
        return self.model_for(self.tool_calls)

    def model_for(self, calls: int) -> str:
        if self.scenario == "codex":
            return codex_model(calls)
        return STOCK_MODEL if calls == SCRIPT_CALLS else coding_model(calls)


@contextlib.asynccontextmanager
async def _server(config: ScenarioConfig, tps: float) -> AsyncIterator[tuple[str, int | None]]:
    """The server's URL and, when the bench started it, its pid (for CPU accounting)."""
    if config.url is not None:
        yield config.url, None
        return
    async with (
        store_url(config.store) as store,
        ServerProcess(
            tps, bench_timings=True, store=store, otel_endpoint=config.otel_endpoint
        ) as server,
    ):
        yield server.url, server.pid


async def _warm_up(config: ScenarioConfig, url: str, tps: float) -> None:
    if config.url is not None:
        return  # a foreign server may not serve the bench models
    for mode in config.modes:
        warm = RunSettings(model=config.model_for(2), scenario=config.scenario)
        await run_mode(mode, url, tps, warm)


def _rotated(modes: list[str], shift: int) -> list[str]:
    shift %= len(modes)
    return modes[shift:] + modes[:shift]


async def run_scenarios(config: ScenarioConfig, progress: RunProgress) -> list[dict[str, Any]]:
    """Every (speed, mode) run, combined over repeats, as JSON-ready dicts."""
    settings = RunSettings(
        model=config.model,
        history_scale=config.history_scale,
        tool_latency_s=config.tool_latency_s,
        max_turns=config.tool_calls + 2,
        scenario=config.scenario,
    )
    runs: list[dict[str, Any]] = []
    for tps in config.speeds:
        results: dict[str, list[RunResult]] = {mode: [] for mode in config.modes}
        async with _server(config, tps) as (url, pid):
            await _warm_up(config, url, tps)
            for repeat in range(config.repeat):
                for mode in _rotated(config.modes, repeat):
                    progress.start(f"{mode} @ {tps:g} tok/s", config.tool_calls + 1)
                    result = await run_mode(mode, url, tps, settings, progress.turn, pid)
                    results[mode].append(result)
                    progress.finish(_one_line(result))
        runs.extend(combine(results[mode]) for mode in config.modes)
    return runs


def _one_line(result: RunResult) -> str:
    overhead = [v for v in result.overhead_ms if v == v]
    return (
        f"e2e {result.e2e_s:.3f} s, overhead median {statistics.median(overhead):.2f} ms, "
        f"last {overhead[-1]:.2f} ms, {result.history_tokens or 0:,} tokens"
    )
