"""The scenario benchmark: for each speed, one server, then every mode (R times, rotated).

Rotating the mode order between repeats spreads any drift of this shared machine (other
processes, thermal state) over all modes instead of always penalising the one that runs last.
A short warm-up rollout per mode (2 tool calls) runs first on each server, so no mode pays for
first-use costs (imports, the tokenizer's caches) in its figures.
"""

from __future__ import annotations

import contextlib
import statistics
import tempfile
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clients.bench.measure import RunResult, RunSettings, run_mode
from clients.bench.proc import ServerProcess
from clients.bench.progress import RunProgress
from clients.bench.report import combine
from clients.bench.scenario import SCRIPT_CALLS, coding_model
from clients.bench.suites.codex import codex_model
from clients.bench.suites.instructions import Callgrind, check_tools
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
    callgrind: bool = False  # the bench's server under callgrind, each run counted (BENCH-13)

    @property
    def model(self) -> str:
        """The stock scripted agent for the stock 26 calls; the bench's looping one otherwise."""
        return self.model_for(self.tool_calls)

    def model_for(self, calls: int) -> str:
        if self.scenario == "codex":
            return codex_model(calls)
        return STOCK_MODEL if calls == SCRIPT_CALLS else coding_model(calls)


@contextlib.asynccontextmanager
async def _server(
    config: ScenarioConfig, tps: float, counter: Callgrind | None
) -> AsyncIterator[tuple[str, int | None]]:
    """The server's URL and, when the bench started it, its pid (for CPU accounting)."""
    if config.url is not None:
        yield config.url, None
        return
    async with (
        store_url(config.store) as store,
        ServerProcess(
            tps, bench_timings=True, store=store, otel_endpoint=config.otel_endpoint,
            counter=counter,
        ) as server,
    ):  # fmt: skip
        yield server.url, server.pid


async def _counted(
    counter: Callgrind | None, pid: int | None, run: Awaitable[RunResult]
) -> RunResult:
    """``run``, its instructions per model turn counted from its own turns when the server
    runs under callgrind (BENCH-13): switched on before its first request, dumped after its
    last, so the warm-up and the other modes' runs are not in it."""
    if counter is None or pid is None:
        return await run
    await counter.begin(pid)
    result = await run
    result.instructions_per_turn = await counter.end(pid) / max(1, len(result.turns))
    return result


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
    with contextlib.ExitStack() as stack:
        counter = None
        if config.callgrind and config.url is None:
            check_tools()
            work = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-callgrind-"))
            counter = Callgrind(Path(work), "engine")
        for tps in config.speeds:
            results: dict[str, list[RunResult]] = {mode: [] for mode in config.modes}
            async with _server(config, tps, counter) as (url, pid):
                await _warm_up(config, url, tps)
                for repeat in range(config.repeat):
                    for mode in _rotated(config.modes, repeat):
                        progress.start(f"{mode} @ {tps:g} tok/s", config.tool_calls + 1)
                        run = run_mode(mode, url, tps, settings, progress.turn, pid)
                        result = await _counted(counter, pid, run)
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
