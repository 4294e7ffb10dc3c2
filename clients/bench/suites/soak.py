"""``rollout bench --soak`` (SPEC: LIVE-9): the cluster as one server, over time.

``rollout cluster`` (two nodes, HAProxy, its own redis-server with its append-only file, API
keys on, ``--memory-budget``) carries mixed openai-SDK traffic from several client processes,
each agent running the scenarios in turn:

- ``ws_chain``: one WebSocket, a chain of ``store: true`` tool turns;
- ``http_chain``: the same over HTTP;
- ``sse``: a streamed HTTP create read to its terminal event;
- ``bg_cancel``: a background run, followed for a few events and then cancelled, each from a
  fresh connection (so from either node, LIVE-2);
- ``bg_follow``: a background run followed to its end from a fresh connection, then polled;
- ``parked``: a WebSocket turn that ends on a tool call, the socket closed, the rollout
  continued from a fresh connection (``store: false`` and ``true`` in turn: hand-over or
  store, PARK-21, LIVE-4, LIVE-5).

Every SDK exception and every unexpected status is a client-visible error (the SDK's own
retries are on, as a user has them). Each node's RSS is sampled every few seconds. With
``kill_interval`` a node is killed -9 every that many seconds (CHAOS-1's schedule, alternating)
and the launcher restarts it; afterwards every acknowledged ``store: true`` response is read
back and every background response started must have reached a terminal state.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import signal
import tempfile
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import openai
from openai import AsyncOpenAI

from clients.bench.scenario import coding_model
from clients.bench.suites.chaos import (
    KEY,
    OPERATOR,
    OPERATOR_ENV,
    ChaosSettings,
    Launched,
    _faults,
    _follow,
    _ready,
    _until_back,
    _verify,
    launch,
)
from clients.bench.suites.load_checks import TOOLS, tool_output

TURNS = 4  # tool turns per chain
SAMPLE_S = 5.0  # RSS sampling period
UNFINISHED = ("queued", "in_progress")
# What shows the cross-node paths ran (LIVE-2, LIVE-4, LIVE-5, PARK-21), summed over the nodes.
COUNTERS = (
    "runs.cancel_forwarded", "runs.follow_forwarded", "runs.remote_cancelled",
    "runs.remote_followed", "create.handed_over", "create.unparked", "create.store_hydrate",
    "park.handover_waited", "park.handover_missed", "park.handover_failed",
    "background.settled",
)  # fmt: skip
SDK_TOOLS: Any = TOOLS  # the SDK's typed params, as plain JSON
Outcome = tuple[float, str, str, str]  # (time, scenario, "ok" or the error, acked id or "")


@dataclass
class SoakSettings:
    seconds: float = 600.0
    client_processes: int = 2
    agents_per_process: int = 3
    kill_interval: float = 0.0  # 0: no faults
    memory_budget: int = 64 * 1024 * 1024
    tps: int = 400  # the simulator's speed: background runs last a moment


class Agent:
    """One client's scenarios, in turn; each records its outcome."""

    def __init__(self, url: str, out: list[Outcome], started: list[str]) -> None:
        self.url = url
        self.out = out
        self.started = started  # background ids, checked terminal afterwards
        self.model = coding_model(TURNS)

    def fresh(self) -> AsyncOpenAI:
        """A new client: a new connection, which the balancer may send to either node."""
        return AsyncOpenAI(base_url=self.url, api_key=KEY, timeout=60.0)

    def ok(self, scenario: str, acked: str = "") -> None:
        self.out.append((time.time(), scenario, "ok", acked))

    async def ws_chain(self, store: bool = True) -> None:
        sdk = self.fresh()
        try:
            async with sdk.responses.connect() as conn:
                body: dict[str, Any] = {"input": "Fix the tests."}
                for _ in range(TURNS + 1):
                    await conn.response.create(
                        model=self.model, tools=SDK_TOOLS, store=store, **body
                    )
                    done = await _terminal(conn)
                    self.ok("ws_chain", done.id)
                    if done.output[-1].type != "function_call":
                        return
                    body = {"previous_response_id": done.id,
                            "input": [tool_output(done.output[-1].call_id)]}  # fmt: skip
        finally:
            await sdk.close()

    async def http_chain(self) -> None:
        sdk = self.fresh()
        try:
            body: dict[str, Any] = {"input": "Fix the tests."}
            for _ in range(TURNS + 1):
                done = await sdk.responses.create(model=self.model, tools=SDK_TOOLS, **body)
                _expect(done.status == "completed", f"status {done.status}")
                self.ok("http_chain", done.id)
                if done.output[-1].type != "function_call":
                    return
                body = {"previous_response_id": done.id,
                        "input": [tool_output(done.output[-1].call_id)]}  # fmt: skip
        finally:
            await sdk.close()

    async def sse(self) -> None:
        sdk = self.fresh()
        try:
            stream = await sdk.responses.create(model="gpt-x", input="Say hi", stream=True)
            last = None
            async for event in stream:
                last = event.type
            _expect(last == "response.completed", f"stream ended on {last}")
            self.ok("sse")
        finally:
            await sdk.close()

    async def background(self, cancel: bool) -> None:
        scenario = "bg_cancel" if cancel else "bg_follow"
        sdk = self.fresh()
        try:
            created = await sdk.responses.create(model="gpt-x", input=LONG, background=True)
        finally:
            await sdk.close()
        self.started.append(created.id)
        seen = await self._follow(created.id, 3 if cancel else None)
        sdk = self.fresh()
        try:
            if cancel:
                done = await sdk.responses.cancel(created.id)
                _expect(done.status in ("cancelled", "completed"), f"cancel: {done.status}")
            else:
                _expect(seen == "response.completed", f"followed to {seen}")
                done = await sdk.responses.retrieve(created.id)
                _expect(done.status == "completed", f"polled {done.status}")
        finally:
            await sdk.close()
        self.ok(scenario, done.id if done.status == "completed" else "")

    async def _follow(self, response_id: str, events: int | None) -> str | None:
        """Follow a run from a fresh connection: ``events`` events, or to its end."""
        sdk = self.fresh()
        last, count = None, 0
        try:
            stream = await sdk.responses.retrieve(response_id, stream=True)
            async for event in stream:
                last, count = event.type, count + 1
                if events is not None and count >= events:
                    break
            await stream.close()
        finally:
            await sdk.close()
        return last

    async def parked(self, store: bool) -> None:
        sdk = self.fresh()
        try:
            async with sdk.responses.connect() as conn:
                await conn.response.create(
                    model=self.model, input="Fix it.", tools=SDK_TOOLS, store=store
                )
                first = await _terminal(conn)
        finally:
            await sdk.close()
        _expect(first.output[-1].type == "function_call", "no tool call")
        sdk = self.fresh()
        try:
            async with sdk.responses.connect() as conn:
                await conn.response.create(
                    model=self.model, tools=SDK_TOOLS, store=store, previous_response_id=first.id,
                    input=[_output(first.output[-1].call_id)],
                )  # fmt: skip
                done = await _terminal(conn)
        finally:
            await sdk.close()
        self.ok("parked", done.id if store else "")

    def scenarios(self) -> list[tuple[str, Callable[[], Awaitable[None]]]]:
        return [
            ("ws_chain", self.ws_chain),
            ("bg_cancel", lambda: self.background(True)),
            ("parked", lambda: self.parked(False)),
            ("http_chain", self.http_chain),
            ("bg_follow", lambda: self.background(False)),
            ("sse", self.sse),
            ("parked", lambda: self.parked(True)),
        ]

    async def run(self, until: float, offset: int) -> None:
        plan = self.scenarios()
        n = offset
        while time.time() < until:
            name, scenario = plan[n % len(plan)]
            n += 1
            try:
                await scenario()
            except Exception as exc:  # every failure the client sees is counted, whatever it is
                self.out.append((time.time(), name, _kind(exc), ""))


LONG = " ".join(f"word{n}" for n in range(40))  # a background run of ~45 tokens


class Failed(Exception):
    """A scenario got an answer it should not have."""


def _expect(holds: bool, what: str) -> None:
    if not holds:
        raise Failed(what)


def _output(call_id: str) -> Any:
    return tool_output(call_id)


def _kind(exc: Exception) -> str:
    if isinstance(exc, openai.APIStatusError):
        code = exc.code if isinstance(exc.code, str) else ""
        return f"{exc.status_code} {code}".strip()
    return f"{type(exc).__name__}: {exc}"[:120]


async def _terminal(conn: Any) -> Any:
    async for event in conn:
        if event.type == "response.completed":
            return event.response
        if event.type in ("response.failed", "response.incomplete", "error"):
            raise Failed(f"{event.type}: {getattr(event, 'error', None)}")
    raise Failed("the socket closed before a terminal event")


def _share(url: str, agents: int, until: float, first: int) -> tuple[list[Outcome], list[str]]:
    async def run() -> tuple[list[Outcome], list[str]]:
        out: list[Outcome] = []
        started: list[str] = []
        crew = [Agent(url, out, started) for _ in range(agents)]
        await asyncio.gather(*(a.run(until, first + i) for i, a in enumerate(crew)))
        return out, started

    return asyncio.run(run())


def _rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


async def _held(http: aiohttp.ClientSession, port: int) -> int | None:
    """What a node's memory budget holds now (``/debug/stats``' ``budget_held``, MEM-12)."""
    try:
        async with http.get(f"http://127.0.0.1:{port}/debug/stats") as resp:
            return sum((await resp.json())["budget_held"].values())  # type: ignore[no-any-return]
    except (aiohttp.ClientError, KeyError, ValueError, TypeError):
        return None  # a node killed or restarting: no reading this time


async def _sample(launched: Launched, samples: list[tuple[float, dict[str, int]]]) -> None:
    """Every SAMPLE_S: each node's RSS (``nodeN``) and its budget's held bytes (``nodeN.held``)."""
    headers = {"Authorization": f"Bearer {OPERATOR}"}
    timeout = aiohttp.ClientTimeout(total=SAMPLE_S)
    async with aiohttp.ClientSession(headers=headers, timeout=timeout) as http:
        while True:
            row: dict[str, int] = {}
            for name, pid in list(launched.pids.items()):
                if name.startswith("node"):
                    row[name] = _rss(pid)
                    port = launched.ports.get(name)
                    held = await _held(http, port) if port else None
                    if held is not None:
                        row[f"{name}.held"] = held
            samples.append((time.time(), row))
            await asyncio.sleep(SAMPLE_S)


def _means(series: list[int]) -> tuple[float, float]:
    """The mean of the middle third and of the last third."""
    third = max(1, len(series) // 3)
    middle = series[third : 2 * third] or series
    last = series[2 * third :] or series
    return sum(middle) / len(middle), sum(last) / len(last)


def _tenths(series: list[int]) -> list[float]:
    """The mean of each tenth of the run, MB (a plateau or a slope)."""
    return [
        round(sum(part) / len(part) / 2**20, 1)
        for n in range(10)
        if (part := series[n * len(series) // 10 : (n + 1) * len(series) // 10])
    ]


def rss_report(samples: list[tuple[float, dict[str, int]]]) -> dict[str, Any]:
    """Per node: the mean RSS of the middle and last thirds of the run and the growth, the
    same for what its memory budget holds (MEM-12: growth the budget accounts for), each by
    tenth, and the whole series (seconds from the start, RSS MB, held MB)."""
    out: dict[str, Any] = {}
    names = sorted({name for _, row in samples for name in row if "." not in name})
    start = samples[0][0] if samples else 0.0
    for name in names:
        series = [row.get(name, 0) for _, row in samples if row.get(name)]
        held = [row[f"{name}.held"] for _, row in samples if f"{name}.held" in row]
        mid_mean, last_mean = _means(series)
        held_mid, held_last = _means(held) if held else (0.0, 0.0)
        out[name] = {
            "rss_mb_middle": round(mid_mean / 2**20, 1),
            "rss_mb_last": round(last_mean / 2**20, 1),
            "rss_mb_max": round(max(series) / 2**20, 1),
            "growth_last_vs_middle": round(last_mean / mid_mean - 1, 4),
            "rss_growth_mb": round((last_mean - mid_mean) / 2**20, 2),
            "held_growth_mb": round((held_last - held_mid) / 2**20, 2),
            "rss_mb_by_tenth": _tenths(series),
            "held_mb_by_tenth": _tenths(held),
            "series": [
                [
                    round(t - start, 1),
                    round(row[name] / 2**20, 1),
                    round(row.get(f"{name}.held", 0) / 2**20, 1),
                ]
                for t, row in samples
                if row.get(name)
            ],
        }
    return out


async def _terminal_states(url: str, ids: list[str]) -> dict[str, int]:
    """Every background response started: terminal by now (LIVE-1: its lease lapsed at most
    15 s after its node died). Polled for up to 40 s."""
    sdk = AsyncOpenAI(base_url=url, api_key=KEY)
    pending = set(ids)
    try:
        for _ in range(80):
            for response_id in list(pending):
                try:
                    got = await sdk.responses.retrieve(response_id)
                except openai.NotFoundError:
                    pending.discard(response_id)  # never stored: its create failed
                    continue
                except openai.OpenAIError:
                    continue
                if got.status not in UNFINISHED:
                    pending.discard(response_id)
            if not pending:
                break
            await asyncio.sleep(0.5)
    finally:
        await sdk.close()
    return {"background_started": len(ids), "background_unfinished": len(pending)}


async def run_soak(settings: SoakSettings, workdir: Path | None = None) -> dict[str, Any]:
    """Start the cluster, run the scenarios for ``seconds``, optionally kill nodes, verify."""
    extra = ["--tps", str(settings.tps), "--memory-budget", str(settings.memory_budget),
             "--admin-keys-env", OPERATOR_ENV]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="rollout-soak-") as tmp:
        launched = await launch(workdir or Path(tmp), extra)
        follower = asyncio.create_task(_follow(launched))
        sampler_rows: list[tuple[float, dict[str, int]]] = []
        sampler = asyncio.create_task(_sample(launched, sampler_rows))
        url = f"http://127.0.0.1:{launched.port}/v1"
        faults: list[dict[str, Any]] = []
        try:
            loop = asyncio.get_running_loop()
            context = multiprocessing.get_context("spawn")
            k, agents = settings.client_processes, settings.agents_per_process
            with ProcessPoolExecutor(max_workers=k, mp_context=context) as pool:
                await asyncio.gather(*(loop.run_in_executor(pool, _ready) for _ in range(k)))
                start = time.time()
                until = start + settings.seconds
                shares = [
                    loop.run_in_executor(pool, _share, url, agents, until, i * agents)
                    for i in range(k)
                ]
                if settings.kill_interval > 0:
                    chaos = ChaosSettings(
                        seconds=settings.seconds, interval=settings.kill_interval,
                        redis_restart=False,
                    )  # fmt: skip
                    faults = await _faults(launched, chaos, start)
                results = await asyncio.gather(*shares)
            sampler.cancel()
            await _until_back(launched, faults)
            outcomes = [o for share, _ in results for o in share]
            started = [i for _, ids in results for i in ids]
            verified = await _verify(
                url, [rid for *_, kind, rid in outcomes if kind == "ok" and rid]
            )
            terminal = await _terminal_states(url, started)
            counters = await _counters(launched)
        finally:
            sampler.cancel()
            launched.proc.send_signal(signal.SIGINT)
            await launched.proc.wait()
            follower.cancel()
    report = _summary(settings, outcomes, faults, sampler_rows, {**verified, **terminal})
    return {**report, "node_counters": counters}


async def _counters(launched: Launched) -> dict[str, int]:
    """The cross-node counters, summed over the nodes (a restarted node's start from 0)."""
    total = dict.fromkeys(COUNTERS, 0)
    headers = {"Authorization": f"Bearer {OPERATOR}"}
    async with aiohttp.ClientSession(headers=headers) as http:
        for port in launched.ports.values():
            try:
                async with http.get(f"http://127.0.0.1:{port}/debug/stats") as resp:
                    counters = (await resp.json())["counters"]
            except (aiohttp.ClientError, KeyError, ValueError):
                continue
            for name in COUNTERS:
                total[name] += int(counters.get(name, 0))
    return total


def _summary(
    settings: SoakSettings,
    outcomes: list[Outcome],
    faults: list[dict[str, Any]],
    rss: list[tuple[float, dict[str, int]]],
    checks: dict[str, int],
) -> dict[str, Any]:
    by_scenario: dict[str, dict[str, int]] = {}
    kinds: dict[str, int] = {}
    for _, scenario, kind, _ in outcomes:
        row = by_scenario.setdefault(scenario, {"ok": 0, "errors": 0})
        row["ok" if kind == "ok" else "errors"] += 1
        if kind != "ok":
            kinds[f"{scenario}: {kind}"] = kinds.get(f"{scenario}: {kind}", 0) + 1
    return {
        "settings": vars(settings),
        "steps": len(outcomes),
        "client_errors": sum(row["errors"] for row in by_scenario.values()),
        "by_scenario": by_scenario,
        "error_kinds": kinds,
        "faults": [{"fault": f["fault"], "at_s": round(f["at"] - rss[0][0], 1)} for f in faults]
        if rss
        else [],
        "rss": rss_report(rss),
        **checks,
    }
