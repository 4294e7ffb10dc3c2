"""Run the scenario once in one mode and turn client-side timestamps into the reported figures.

Per turn (all measured on the client, loopback):

* ``ttft``: from the request leaving the client to the first model delta event arriving;
* ``overhead = ttft - simulator TTFT``: the simulator paces token n at ``start + n/tps`` and
  sleeps only when more than 0.5 ms ahead (``engine.models.sim.simulator._Pacer``), so its own
  time to the first token is ``1/tps`` when that exceeds 0.5 ms and ~0 otherwise (4,000 tokens/s,
  unlimited). What is left is the server's own work: reading and decoding the request,
  pre-inference, routing, resuming the coroutine, building and writing the events;
* ``first_item``: time to ``response.output_item.added``; for a tool-call turn the simulator
  emits it before any pacing, so it is an overhead figure free of timer granularity;
* ``tail``: from the model's last delta to the terminal event: closing the items and, for
  ``store: true``, the durable write that precedes the terminal event (STORE-6, BENCH-6).

Tool time is measured separately (``tool_s``) and is never inside a turn's clock.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from clients.bench.lean_wire import BenchError, TurnResult, now
from clients.bench.proc import sched_ns, written_bytes
from clients.bench.scenario import ScenarioTools
from clients.bench.suites.codex import CodexTools
from clients.bench.transports import make_transport

# The server's stages reported per turn (``--bench-timings`` records, SPEC OBS-5).
SERVER_STAGES = (
    "pre_inference", "decode", "queue", "validate", "scan", "render", "header", "dispatch",
    "send", "post", "store",
)  # fmt: skip
PACER_MIN_SLEEP_S = 0.0005  # _Pacer sleeps only when at least this far ahead of schedule


def simulator_ttft_s(tokens_per_second: float) -> float:
    """The simulator's own delay before the first token (see the module docstring)."""
    if tokens_per_second <= 0:
        return 0.0
    interval = 1.0 / tokens_per_second
    return interval if interval > PACER_MIN_SLEEP_S else 0.0


@dataclass
class RunSettings:
    model: str
    history_scale: int = 1
    tool_latency_s: float = 0.0
    max_turns: int = 1000
    scenario: str = "coding"  # or "codex" (clients/bench/suites/codex.py)


def scenario_tools(settings: RunSettings) -> ScenarioTools | CodexTools:
    """The client-side tools of the scenario (a fresh sandbox / output schedule per run)."""
    if settings.scenario == "codex":
        return CodexTools(settings.history_scale, settings.tool_latency_s)
    return ScenarioTools(settings.history_scale, settings.tool_latency_s)


@dataclass
class RunResult:
    mode: str
    tps: float
    e2e_s: float
    tool_s: float
    turns: list[TurnResult]
    history_tokens: int | None  # the server's count at the last turn (None: not reported)
    server_input_tokens: int | None = None
    new_tokens: list[int] = field(default_factory=list)  # tokens of the items each turn added
    instructions_per_turn: float | None = None  # counted by callgrind (BENCH-13)

    def _ms(self, stamp: Callable[[TurnResult], float | None], minus: float = 0.0) -> list[float]:
        out = []
        for turn in self.turns:
            at = stamp(turn)
            out.append(float("nan") if at is None else (at - turn.t_send - minus) * 1000.0)
        return out

    @property
    def ttft_ms(self) -> list[float]:
        return self._ms(lambda t: t.t_first_delta)

    @property
    def overhead_ms(self) -> list[float]:
        return self._ms(lambda t: t.t_first_delta, simulator_ttft_s(self.tps))

    @property
    def first_item_ms(self) -> list[float]:
        return self._ms(lambda t: t.t_first_item)

    @property
    def tail_ms(self) -> list[float]:
        out = []
        for turn in self.turns:
            last = turn.t_last_delta
            out.append(float("nan") if last is None else (turn.t_end - last) * 1000.0)
        return out

    @property
    def server_cpu_ms(self) -> list[float | None]:
        return [_ns_ms(t.server_cpu_ns) for t in self.turns]

    @property
    def server_wait_ms(self) -> list[float | None]:
        return [_ns_ms(t.server_wait_ns) for t in self.turns]

    def stage_ms(self, stage: str) -> list[float | None]:
        """One server stage per turn, from the server's own clocks (OBS-5), in ms."""
        return [
            None if t.server is None else round(t.server["stages"].get(stage, 0.0) * 1e3, 4)
            for t in self.turns
        ]

    def as_json(self) -> dict[str, Any]:
        stages: dict[str, Any] = {f"server_{n}_ms": self.stage_ms(n) for n in SERVER_STAGES}
        if self.instructions_per_turn is not None:  # BENCH-13
            stages["instructions_per_turn"] = self.instructions_per_turn
        return {
            **stages,
            "prompt_tokens": [t.server["prompt_tokens"] if t.server else None for t in self.turns],
            "mode": self.mode,
            "tps": self.tps,
            "e2e_s": round(self.e2e_s, 6),
            "tool_s": round(self.tool_s, 6),
            "turns": len(self.turns),
            "tool_calls": sum(len(t.calls) for t in self.turns),
            "history_tokens": self.history_tokens,
            "new_tokens": self.new_tokens,
            "server_input_tokens": self.server_input_tokens,
            "per_turn_overhead_ms": _rounded(self.overhead_ms),
            "ttft_ms": _rounded(self.ttft_ms),
            "first_item_ms": _rounded(self.first_item_ms),
            "turn_ms": _rounded(self._ms(lambda t: t.t_end)),  # request sent -> turn's last event
            "tail_ms": _rounded(self.tail_ms),
            "server_cpu_ms": self.server_cpu_ms,
            "server_wait_ms": self.server_wait_ms,
            "server_written_bytes": [t.server_written for t in self.turns],
            "events": sum(t.events for t in self.turns),
        }


def _rounded(values: list[float]) -> list[float | None]:
    return [None if v != v else round(v, 4) for v in values]  # NaN -> null


def _ns_ms(value: int | None) -> float | None:
    return None if value is None else round(value / 1e6, 4)


async def _probed(server_pid: int | None, turn: Awaitable[TurnResult]) -> TurnResult:
    """Await one turn, charging it the server's CPU and run-queue time (read outside the
    turn's clock: before the request is encoded and after its last event arrived)."""
    if server_pid is None:
        return await turn
    cpu0, wait0 = sched_ns(server_pid)
    written0 = written_bytes(server_pid)
    result = await turn
    cpu1, wait1 = sched_ns(server_pid)
    result.server_cpu_ns, result.server_wait_ns = cpu1 - cpu0, wait1 - wait0
    result.server_written = written_bytes(server_pid) - written0
    return result


async def run_mode(
    mode: str,
    base_url: str,
    tps: float,
    settings: RunSettings,
    on_turn: Callable[[int], None] | None = None,
    server_pid: int | None = None,
) -> RunResult:
    """One full rollout of the scenario in ``mode``; tools run for real between turns."""
    async with scenario_tools(settings) as tools:
        body = tools.first_request(settings.model)
        transport = make_transport(mode, base_url)
        start = now()
        tool_s = 0.0
        try:
            await transport.open()
            turn = await _probed(server_pid, transport.first(body))
            turns = [turn]
            while turn.calls:
                if len(turns) >= settings.max_turns:
                    raise BenchError(f"more than {settings.max_turns} turns")
                if on_turn is not None:
                    on_turn(len(turns))
                results = await tools.run(turn.calls)
                tool_s += max(r.seconds for r in results)
                turn = await _probed(server_pid, transport.answer(turn, results))
                turns.append(turn)
            e2e = now() - start
        finally:
            await transport.close()
    # The history's size is the server's own count (one chat template:
    # engine/conversation/render.py). A
    # server without --bench-timings (--url) reports it only in a standard mode's usage.
    if await attach_timings(base_url, turns):
        history_tokens: int | None = turns[-1].server["prompt_tokens"]  # type: ignore[index]
        new_tokens = [t.server["rendered_tokens"] for t in turns]  # type: ignore[index]
    else:
        history_tokens = None if mode == "ws_append" else turns[-1].input_tokens
        new_tokens = []
    return RunResult(
        mode=mode,
        tps=tps,
        e2e_s=e2e,
        tool_s=tool_s,
        turns=turns,
        history_tokens=history_tokens,
        new_tokens=new_tokens,
        server_input_tokens=turns[-1].input_tokens,
    )


async def fetch_timings(base_url: str) -> list[dict[str, Any]] | None:
    """The server's per-turn timing records since the last fetch, or None when it keeps none
    (it was not started with ``--bench-timings``)."""
    url = base_url.rstrip("/") + "/bench/timings"
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        if resp.status != 200:
            return None
        body = await resp.json()
    records: list[dict[str, Any]] = body["data"]
    return records


async def attach_timings(base_url: str, turns: list[TurnResult]) -> bool:
    """Give each turn its server record (matched by response id, in order: an append-mode
    response has one record per turn). True when every turn got one."""
    records = await fetch_timings(base_url)
    if records is None:
        return False
    by_id: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        by_id.setdefault(record["response_id"], []).append(record)
    for turn in turns:
        queue = by_id.get(turn.response_id)
        turn.server = queue.pop(0) if queue else None
    return all(t.server is not None for t in turns)
