"""Bounded load test (SPEC: LOAD-1): many WebSocket agents plus HTTP traffic, checked event by
event, on loopback only.

Each WebSocket connection runs one agent rollout of N tool-call turns (standard mode with
``previous_response_id`` on even connections, append mode on odd ones) while HTTP clients send
stateless requests alongside. Every frame is checked: sequence numbers start at 0 and step by 1
within a response, exactly one terminal per response, nothing after it. The report gives lost
and misordered events, p50/p99 per-turn overhead (request sent -> first delta), peak RSS of the
server process and RSS after all connections closed.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgspec

from clients.bench.proc import ServerProcess, cpu_seconds, rss_bytes
from clients.bench.resume import resuming_agent, verify_acknowledged
from clients.bench.scenario import coding_model

TERMINALS = frozenset({"response.completed", "response.failed", "response.incomplete"})
DELTAS = frozenset({"response.output_text.delta", "response.function_call_arguments.delta"})
TOOLS = [
    {"type": "function", "name": name, "parameters": {"type": "object", "properties": {}}}
    for name in ("list_dir", "read_file", "search", "edit_file", "run_tests")
]
OUTPUT = "def handler(request):\n    return respond(request.body)\n" * 60  # ~3.4 KB
_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode


@dataclass
class LoadSettings:
    connections: int = 200
    turns: int = 20
    http_clients: int = 8
    resume: bool = False  # store: true agents that reconnect at a drain (LOAD-2)
    client_processes: int = 1  # the client split over this many processes (LOAD-3)
    server_pids: tuple[int, ...] = ()  # with --url: the nodes whose CPU time is read (LOAD-3)


@dataclass
class LoadCounts:
    """What the checkers saw, over all connections."""

    responses: int = 0
    turns: int = 0
    misordered: int = 0  # a sequence number that is not the previous one + 1
    lost: int = 0  # a response that never reached its terminal, or events after one
    errors: list[str] = field(default_factory=list)
    overhead_ms: list[float] = field(default_factory=list)
    http_requests: int = 0
    http_failures: int = 0
    acknowledged: list[str] = field(default_factory=list)  # completed, store: true (LOAD-2)
    reconnects: int = 0
    reconnect_ms: list[float] = field(default_factory=list)  # drain signal -> new socket
    http_failure_kinds: Counter[str] = field(default_factory=Counter)  # status and code
    drain_signals: Counter[str] = field(default_factory=Counter)  # by documented kind
    # time.monotonic() (one clock for every process) when the first agent started and the last
    # finished: the wall time of the run, however many client processes shared it
    window: tuple[float, float] = (0.0, 0.0)

    def merge(self, other: LoadCounts) -> None:
        """Add another client process's counts to these (LOAD-3)."""
        for name in ("responses", "turns", "misordered", "lost", "http_requests"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.http_failures += other.http_failures
        self.reconnects += other.reconnects
        self.reconnect_ms += other.reconnect_ms
        self.errors += other.errors
        self.overhead_ms += other.overhead_ms
        self.acknowledged += other.acknowledged
        self.drain_signals.update(other.drain_signals)
        self.http_failure_kinds.update(other.http_failure_kinds)
        if self.window == (0.0, 0.0):
            self.window = other.window
        else:
            self.window = (
                min(self.window[0], other.window[0]),
                max(self.window[1], other.window[1]),
            )


class _Checker:
    """Reads one socket's frames and checks the per-response ordering invariants."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, counts: LoadCounts) -> None:
        self.ws, self.counts = ws, counts
        self.expected = 0

    async def until(self, *types: str, sent_at: float) -> dict[str, Any]:
        first_delta = True
        while True:
            msg = await self.ws.receive(timeout=60)
            if msg.type is not aiohttp.WSMsgType.TEXT:  # counted as lost by the caller
                raise ConnectionError(f"socket ended: {msg.type}")
            event: dict[str, Any] = _decode(msg.data)
            if event["type"] == "error":
                self.counts.errors.append(event["error"]["code"])
                raise ConnectionError(event["error"]["code"])
            if event.get("sequence_number") != self.expected:
                self.counts.misordered += 1
            self.expected = event.get("sequence_number", self.expected) + 1
            if first_delta and event["type"] in DELTAS:
                first_delta = False
                self.counts.overhead_ms.append((time.perf_counter() - sent_at) * 1000)
            if event["type"] in types:
                return event

    async def send(self, body: dict[str, Any]) -> float:
        await self.ws.send_str(_encode(body).decode())
        return time.perf_counter()


def tool_output(call_id: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": OUTPUT}


async def _standard_agent(check: _Checker, turns: int) -> None:
    body: dict[str, Any] = {
        "type": "response.create",
        "model": coding_model(turns),
        "input": "Fix the tests.",
        "tools": TOOLS,
        "store": False,
    }
    while True:
        check.expected = 0  # every standard-mode response numbers its events from 0
        done = await check.until(*TERMINALS, sent_at=await check.send(body))
        check.counts.responses += 1
        check.counts.turns += 1
        last = done["response"]["output"][-1]
        if last["type"] != "function_call":
            return
        body = {
            **body,
            "previous_response_id": done["response"]["id"],
            "input": [tool_output(last["call_id"])],
        }


async def _append_agent(check: _Checker, turns: int) -> None:
    body = {
        "type": "response.create",
        "model": coding_model(turns),
        "input": "Fix the tests.",
        "tools": TOOLS,
        "store": False,
        "rollout_mode": "append",
    }
    sent = await check.send(body)
    while True:  # one response: numbering continues across suspensions
        event = await check.until("response.done", *TERMINALS, sent_at=sent)
        check.counts.turns += 1
        if event["type"] in TERMINALS:
            check.counts.responses += 1
            return
        calls = event["pending_calls"]
        sent = await check.send(
            {
                "type": "response.append",
                "response_id": event["response"]["id"],
                "input": [tool_output(c["call_id"]) for c in calls],
            }
        )


async def _agent(
    session: aiohttp.ClientSession, url: str, index: int, settings: LoadSettings, counts: LoadCounts
) -> None:
    ws_url = url.replace("http://", "ws://", 1) + "/responses"
    try:
        if settings.resume:
            await resuming_agent(session, ws_url, settings.turns, counts, _Checker)
            return
        async with session.ws_connect(ws_url, max_msg_size=0) as ws:
            check = _Checker(ws, counts)
            agent = _append_agent if index % 2 else _standard_agent
            await agent(check, settings.turns)
    except (ConnectionError, aiohttp.ClientError, TimeoutError) as exc:
        counts.lost += 1
        counts.errors.append(type(exc).__name__)


async def _http_client(
    session: aiohttp.ClientSession, url: str, stop: asyncio.Event, counts: LoadCounts
) -> None:
    while not stop.is_set():
        body = {"model": "sim", "input": "Summarise the load test.", "store": False}
        kind = "ok"
        try:
            async with session.post(f"{url}/responses", json=body) as resp:
                payload = await resp.json()
                if resp.status != 200 or payload.get("status") != "completed":
                    kind = f"{resp.status} {payload.get('error', {}).get('code', '')}".strip()
        except aiohttp.ClientError as exc:
            kind = type(exc).__name__
        counts.http_requests += 1
        if kind != "ok":
            counts.http_failures += 1
            counts.http_failure_kinds[kind] += 1


async def _sample_rss(pid: int, stop: asyncio.Event, peak: list[int]) -> None:
    while not stop.is_set():
        peak[0] = max(peak[0], rss_bytes(pid))
        await asyncio.sleep(0.05)


async def drive(settings: LoadSettings, url: str, agents: range, http_clients: int) -> LoadCounts:
    """Run the agents numbered ``agents`` and ``http_clients`` HTTP clients until the agents
    finish: one client process's share of the load."""
    counts, stop = LoadCounts(), asyncio.Event()
    connector = aiohttp.TCPConnector(limit=0)
    started = time.monotonic()
    async with aiohttp.ClientSession(connector=connector) as session:
        background = [
            asyncio.create_task(_http_client(session, url, stop, counts))
            for _ in range(http_clients)
        ]
        await asyncio.gather(*(_agent(session, url, n, settings, counts) for n in agents))
        stop.set()
        await asyncio.gather(*background)
    counts.window = (started, time.monotonic())
    return counts


async def run_load(settings: LoadSettings, url: str, pid: int | None) -> dict[str, Any]:
    """Drive the server at ``url`` and return the report (no assertions: figures for the note).
    ``pid`` is the bench's own server (for RSS); None for a running server (``--url``), whose
    processes' CPU time is read from ``settings.server_pids`` when given."""
    stop, peak = asyncio.Event(), [0]
    pids = (pid,) if pid is not None else settings.server_pids
    baseline = rss_bytes(pid) if pid is not None else 0
    sampler = asyncio.create_task(_sample_rss(pid, stop, peak)) if pid is not None else None
    cpu0 = [cpu_seconds(p) for p in pids]
    if settings.client_processes > 1:
        from clients.bench.fanout import drive_in_processes

        counts = await drive_in_processes(settings, url)
    else:
        counts = await drive(settings, url, range(settings.connections), settings.http_clients)
    elapsed = counts.window[1] - counts.window[0]
    cpu = [cpu_seconds(p) - c for p, c in zip(pids, cpu0, strict=True)]
    stop.set()
    if sampler is not None:
        await sampler
    await asyncio.sleep(1.0)  # let the server notice the closes and release the rollouts
    after = rss_bytes(pid) if pid is not None else 0
    report = _report(settings, counts, elapsed, baseline, peak[0], after)
    if settings.resume:
        async with aiohttp.ClientSession() as session:
            found = await verify_acknowledged(session, url, counts.acknowledged)
        report["acknowledged_missing"] = found["missing"]
    # Turns per second of wall time are bounded by this machine (the client shares its cores);
    # per server CPU-second is what one server process can serve when it has a core to itself.
    total = sum(cpu)
    report["server_cpu_s"] = round(total, 2) if pids else None
    report["server_cpu_s_per_process"] = [round(c, 2) for c in cpu]
    report["turns_per_server_cpu_s"] = round(counts.turns / total, 1) if total else None
    return report


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def _report(
    settings: LoadSettings, counts: LoadCounts, elapsed: float, baseline: int, peak: int, after: int
) -> dict[str, Any]:
    expected = settings.connections * (settings.turns + 1)
    return {
        "settings": {
            "connections": settings.connections,
            "turns": settings.turns,
            "http_clients": settings.http_clients,
            "resume": settings.resume,
            "client_processes": settings.client_processes,
        },
        "elapsed_s": round(elapsed, 2),
        "turns_per_s": round(counts.turns / elapsed, 1) if elapsed > 0 else None,
        "turns": counts.turns,
        "turns_expected": expected,
        "responses": counts.responses,
        "lost": counts.lost,
        "misordered": counts.misordered,
        "errors": sorted(set(counts.errors)),
        "overhead_p50_ms": _percentile(counts.overhead_ms, 0.50),
        "overhead_p99_ms": _percentile(counts.overhead_ms, 0.99),
        "http_requests": counts.http_requests,
        "http_failures": counts.http_failures,
        "http_failure_kinds": dict(counts.http_failure_kinds),
        "acknowledged": len(counts.acknowledged),
        "reconnects": counts.reconnects,
        "reconnect_p50_ms": _percentile(counts.reconnect_ms, 0.50),
        "reconnect_p99_ms": _percentile(counts.reconnect_ms, 0.99),
        "drain_signals": dict(counts.drain_signals),
        "rss_baseline_mib": round(baseline / 2**20, 1),
        "rss_peak_mib": round(peak / 2**20, 1),
        "rss_after_mib": round(after / 2**20, 1),
    }


async def main_load(settings: LoadSettings, url: str | None = None) -> dict[str, Any]:
    """On the bench's own server (tps 0), or on a running one at ``url`` (no RSS figures: e.g.
    ``rollout serve --bench-models --tps 0 --workers N``, WORK-1)."""
    if url is not None:
        return await run_load(settings, url.rstrip("/"), None)
    async with ServerProcess(tokens_per_second=0) as server:
        return await run_load(settings, server.url, server.pid)
