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
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import aiohttp

from clients.bench.proc import ServerProcess, cpu_seconds, rss_bytes
from clients.bench.scenario import coding_model
from clients.bench.suites.load_checks import (
    TERMINALS,
    TOOLS,
    Checker,
    LoadCounts,
    tool_output,
)
from clients.bench.suites.resume import resuming_agent, verify_acknowledged


@dataclass
class LoadSettings:
    connections: int = 200
    turns: int = 20
    http_clients: int = 8
    resume: bool = False  # store: true agents that reconnect at a drain (LOAD-2)
    client_processes: int = 1  # the client split over this many processes (LOAD-3)
    server_pids: tuple[int, ...] = ()  # with --url: the nodes whose CPU time is read (LOAD-3)
    api_key: str | None = None  # with --url: every request's Bearer key (one tenant, CLUSTER-16)


async def _standard_agent(check: Checker, turns: int) -> None:
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


async def _append_agent(check: Checker, turns: int) -> None:
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
            await resuming_agent(session, ws_url, settings.turns, counts)
            return
        async with session.ws_connect(ws_url, max_msg_size=0) as ws:
            check = Checker(ws, counts)
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


async def drive(
    settings: LoadSettings,
    url: str,
    agents: range,
    http_clients: int,
    headers: dict[str, str] | None = None,
) -> LoadCounts:
    """Run the agents numbered ``agents`` and ``http_clients`` HTTP clients until the agents
    finish: one client process's share of the load. ``headers`` go with every request (a key,
    ``--load-two-keys``)."""
    counts, stop = LoadCounts(), asyncio.Event()
    connector = aiohttp.TCPConnector(limit=0)
    started = time.monotonic()
    auth = {**_auth(settings), **(headers or {})}
    async with aiohttp.ClientSession(connector=connector, headers=auth) as session:
        background = [
            asyncio.create_task(_http_client(session, url, stop, counts))
            for _ in range(http_clients)
        ]
        await asyncio.gather(*(_agent(session, url, n, settings, counts) for n in agents))
        stop.set()
        await asyncio.gather(*background)
    counts.window = (started, time.monotonic())
    return counts


# --client-processes K (LOAD-3): the load client split over K OS processes, so that on a small
# machine one client's event loop is not the ceiling of what the servers are measured to serve.
# Process i of K runs the agents i, i+K, i+2K, ... (standard and append mode stay mixed) and its
# share of the HTTP clients, each on its own event loop; the parent merges their counts (sums,
# and the overhead samples, so percentiles are of the whole run).
START_DELAY_S = 3.0  # time for K interpreters to start and import, so the shares start together


def _share(settings: LoadSettings, url: str, index: int, start_at: float) -> LoadCounts:
    """In a child process: this share of the load, on a fresh event loop, from ``start_at``
    (``time.monotonic``, the same clock in every process) on."""
    time.sleep(max(0.0, start_at - time.monotonic()))
    k = settings.client_processes
    http_clients = settings.http_clients // k + (1 if index < settings.http_clients % k else 0)
    agents = range(index, settings.connections, k)
    return asyncio.run(drive(replace(settings, client_processes=1), url, agents, http_clients))


async def drive_in_processes(settings: LoadSettings, url: str) -> LoadCounts:
    """Run K shares at once (``spawn``: no inherited event loop or sockets) and merge them."""
    k = settings.client_processes
    loop, start_at = asyncio.get_running_loop(), time.monotonic() + START_DELAY_S
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=k, mp_context=context) as pool:
        shares = await asyncio.gather(
            *(loop.run_in_executor(pool, _share, settings, url, i, start_at) for i in range(k))
        )
    merged = LoadCounts()
    for counts in shares:
        merged.merge(counts)
    return merged


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
        async with aiohttp.ClientSession(headers=_auth(settings)) as session:
            found = await verify_acknowledged(session, url, counts.acknowledged)
        report["acknowledged_missing"] = found["missing"]
    # Turns per second of wall time are bounded by this machine (the client shares its cores);
    # per server CPU-second is what one server process can serve when it has a core to itself.
    total = sum(cpu)
    report["server_cpu_s"] = round(total, 2) if pids else None
    report["server_cpu_s_per_process"] = [round(c, 2) for c in cpu]
    report["turns_per_server_cpu_s"] = round(counts.turns / total, 1) if total else None
    # Each node's share of the work (CLUSTER-16): its part of the server CPU time.
    report["server_cpu_share"] = [round(c / total, 3) for c in cpu] if total else None
    return report


def _auth(settings: LoadSettings) -> dict[str, str]:
    return {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}


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
