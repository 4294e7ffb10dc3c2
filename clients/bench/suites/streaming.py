"""``--stream``: is streaming ever the bottleneck?

1. One connection, a long text answer at 4,000 tokens/s: the token rate the client actually
   receives (first to last delta) against the model's rate.
2. Many connections at unlimited speed (tps 0): text delta events per second that one server
   process delivers, counted by the client. Client and server share this machine's cores, so
   the server's CPU use over the window is reported too, and the rate per server CPU-second
   (what one fully busy server process would sustain).

Both use the bench server's ``bench-text/N`` model (the simulator's pacing, a long answer).
The counting client looks only at each frame's first bytes: the cheapest client possible, so
the figure is the server's, not the client's.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from clients.bench.lean_wire import ENCODER, BenchError, now
from clients.bench.proc import ServerProcess, cpu_seconds
from clients.bench.scenario import text_model
from clients.bench.transports import RawSocket, connect_ws

_DELTA = b'"response.output_text.delta"'
_DONE = b'"response.completed"'
_FAILED = (b'"response.failed"', b'"response.incomplete"', b'"error"')


@dataclass
class StreamSettings:
    single_tps: float = 4000.0
    single_tokens: int = 20_000
    connections: int = 32
    tokens_per_response: int = 5_000
    seconds: float = 8.0


def _create(tokens: int) -> bytes:
    return ENCODER.encode(
        {
            "type": "response.create",
            "model": text_model(tokens),
            "input": "Write at length.",
            "store": False,
        }
    )


async def _one_response(ws: RawSocket, frame: bytes) -> list[float]:
    """Send one create; return the arrival time of every text delta until it completes."""
    await ws.send_frame(frame, aiohttp.WSMsgType.TEXT)
    arrivals: list[float] = []
    while True:
        msg = await ws.receive()
        if msg.type is not aiohttp.WSMsgType.TEXT:
            raise BenchError(f"websocket closed mid-response ({msg.type.name})")
        head = msg.data[:64]
        if _DELTA in head:
            arrivals.append(now())
        elif _DONE in head:
            return arrivals
        elif any(f in head for f in _FAILED):
            raise BenchError(f"stream failed: {msg.data[:300]!r}")


async def single_connection(url: str, tps: float, tokens: int) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session:
        ws = await connect_ws(session, url)
        await _one_response(ws, _create(50))  # warm-up: connection and code paths
        t0 = now()
        arrivals = await _one_response(ws, _create(tokens))
        await ws.close()
    span = arrivals[-1] - arrivals[0]
    return {
        "model_tps": tps,
        "tokens": len(arrivals),
        "achieved_tps": (len(arrivals) - 1) / span,
        # Counted from the request: a late first token cannot be hidden by catching up after.
        "achieved_tps_from_request": len(arrivals) / (arrivals[-1] - t0),
        "ttft_ms": (arrivals[0] - t0) * 1000.0,
        "wall_s": arrivals[-1] - t0,
    }


async def _lane(ws: RawSocket, frame: bytes, until: float, counts: list[int]) -> None:
    while now() < until:
        counts.append(len(await _one_response(ws, frame)))


async def many_connections(url: str, pid: int, settings: StreamSettings) -> dict[str, Any]:
    frame = _create(settings.tokens_per_response)
    counts: list[int] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        sockets = [await connect_ws(session, url) for _ in range(settings.connections)]
        await asyncio.gather(*(_one_response(ws, _create(50)) for ws in sockets))
        cpu0, t0, client0 = cpu_seconds(pid), now(), time.process_time()
        until = t0 + settings.seconds
        await asyncio.gather(*(_lane(ws, frame, until, counts) for ws in sockets))
        wall, cpu = now() - t0, cpu_seconds(pid) - cpu0
        client_cpu = time.process_time() - client0
        await asyncio.gather(*(ws.close() for ws in sockets))
    events = sum(counts)
    return {
        "connections": settings.connections,
        "responses": len(counts),
        "tokens_per_response": settings.tokens_per_response,
        "delta_events": events,
        "wall_s": wall,
        "delta_events_per_s": events / wall,
        "server_cpu_pct": 100.0 * cpu / wall,
        "client_cpu_pct": 100.0 * client_cpu / wall,
        "delta_events_per_server_cpu_s": events / cpu if cpu > 0 else float("nan"),
    }


async def run_stream(settings: StreamSettings, url: str | None = None) -> dict[str, Any]:
    """Both measurements, each on its own server (the model speed is a server setting)."""
    if url is not None:
        raise BenchError("--stream needs the bench's own server (its bench-text model); drop --url")
    async with ServerProcess(settings.single_tps) as server:
        single = await single_connection(server.url, settings.single_tps, settings.single_tokens)
    async with ServerProcess(0.0) as server:
        many = await many_connections(server.url, server.pid, settings)
    return {"single": single, "many": many}
