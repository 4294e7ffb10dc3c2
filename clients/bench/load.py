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
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgspec

from clients.bench.proc import ServerProcess, cpu_seconds, rss_bytes
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


def _output(call_id: str) -> dict[str, Any]:
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
            "input": [_output(last["call_id"])],
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
                "input": [_output(c["call_id"]) for c in calls],
            }
        )


async def _agent(
    session: aiohttp.ClientSession, url: str, index: int, settings: LoadSettings, counts: LoadCounts
) -> None:
    ws_url = url.replace("http://", "ws://", 1) + "/responses"
    try:
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
        try:
            async with session.post(f"{url}/responses", json=body) as resp:
                payload = await resp.json()
                ok = resp.status == 200 and payload.get("status") == "completed"
        except aiohttp.ClientError:
            ok = False
        counts.http_requests += 1
        counts.http_failures += 0 if ok else 1


async def _sample_rss(pid: int, stop: asyncio.Event, peak: list[int]) -> None:
    while not stop.is_set():
        peak[0] = max(peak[0], rss_bytes(pid))
        await asyncio.sleep(0.05)


async def run_load(settings: LoadSettings, url: str, pid: int | None) -> dict[str, Any]:
    """Drive the server at ``url`` and return the report (no assertions: figures for the note).
    ``pid`` is the bench's own server (for RSS); None for a running server (``--url``)."""
    counts, stop, peak = LoadCounts(), asyncio.Event(), [0]
    baseline = rss_bytes(pid) if pid is not None else 0
    connector = aiohttp.TCPConnector(limit=0)
    started, cpu0 = time.perf_counter(), (cpu_seconds(pid) if pid is not None else 0.0)
    async with aiohttp.ClientSession(connector=connector) as session:
        tasks = [_sample_rss(pid, stop, peak)] if pid is not None else []
        tasks += [_http_client(session, url, stop, counts) for _ in range(settings.http_clients)]
        background = [asyncio.create_task(task) for task in tasks]
        await asyncio.gather(
            *(_agent(session, url, n, settings, counts) for n in range(settings.connections))
        )
        stop.set()
        await asyncio.gather(*background)
    elapsed = time.perf_counter() - started
    cpu = cpu_seconds(pid) - cpu0 if pid is not None else 0.0
    await asyncio.sleep(1.0)  # let the server notice the closes and release the rollouts
    after = rss_bytes(pid) if pid is not None else 0
    report = _report(settings, counts, elapsed, baseline, peak[0], after)
    # Turns per second of wall time are bounded by this machine (the client shares its cores);
    # per server CPU-second is what one server process can serve when it has a core to itself.
    report["server_cpu_s"] = round(cpu, 2) if pid is not None else None
    report["turns_per_server_cpu_s"] = round(counts.turns / cpu, 1) if cpu else None
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
