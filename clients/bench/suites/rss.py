"""``--memory``: what 1,000 suspended rollouts with ~10k-token histories cost in server RSS.

Each rollout is a standard-mode ``response.create`` (``store: false``) whose input is a real
coding-agent history (the scenario's calls and the sandbox's real outputs, ending in a tool
output, with a distinct user task per rollout), so the model answers with a tool call and the
coroutine stays suspended on the lane, holding its items and token array. Rollouts ride on
``stream_id`` lanes (at most 32 named lanes per connection, LIM-3), so N rollouts need only
N/lanes sockets. They are opened one connection at a time, so the transient request buffers of
one batch are all that is in flight.

RSS is the server subprocess's ``VmRSS`` after a warm-up rollout (before) and once every
rollout is suspended (after). Raw state is what the rollouts must hold at minimum: their token
arrays (4 bytes per token: the last prompt plus the absorbed tool call) and their items (the
JSON size of every input item as sent plus every output item as received).
"""

from __future__ import annotations

import asyncio
import resource
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgspec

from clients.bench.lean_wire import ENCODER, BenchError, RawTurnReader, now
from clients.bench.measure import fetch_timings
from clients.bench.proc import ServerProcess, rss_bytes
from clients.bench.scenario import SCRIPT_CALLS, Call, ScenarioTools, first_request
from clients.bench.transports import RawSocket, connect_ws, make_transport

MODEL = "sim-coding-agent"


@dataclass
class MemorySettings:
    rollouts: int = 1000
    history_tokens: int = 10_000
    lanes: int = 25  # rollouts per connection (named lanes; at most 32)


async def build_history(url: str, target_tokens: int) -> tuple[dict[str, Any], list[Any]]:
    """The opening body and a history of the scripted agent's calls with the sandbox's real
    outputs, cut at the first call after which the prompt reaches ``target_tokens``.

    The calls come from the server itself (one ``ws_compat`` rollout of ``sim-coding-agent``),
    and so does the count: each turn's ``usage.input_tokens`` is the prompt the server rendered
    for it (the chat template exists only in ``engine/conversation/render.py``). Call ids are
    renumbered
    (``call_000``, ...) so the history is the same on every run."""
    async with ScenarioTools() as tools:
        body = first_request(MODEL, tools.definitions())
        history: list[Any] = list(body["input"])
        transport = make_transport("ws_compat", url)
        try:
            await transport.open()
            turn = await transport.first(body)
            while turn.calls and len(history) // 2 < SCRIPT_CALLS - 1:  # the model must not end
                results = await tools.run(turn.calls)
                for call, result in zip(turn.calls, results, strict=True):
                    _append_step(history, call, result.output)
                turn = await transport.answer(turn, results)
                if (turn.input_tokens or 0) >= target_tokens:  # the prompt with these steps
                    return body, history
        finally:
            await transport.close()
    raise BenchError(f"the scenario has fewer than {target_tokens} tokens of history")


def _append_step(history: list[Any], call: Call, output: str) -> None:
    call_id = f"call_{len(history) // 2:03d}"
    history.append(
        {
            "type": "function_call",
            "call_id": call_id,
            "name": call.name,
            "arguments": call.arguments,
        }
    )
    history.append({"type": "function_call_output", "call_id": call_id, "output": output})


def _create(body: dict[str, Any], history: list[Any], index: int, lane: str) -> dict[str, Any]:
    task = {"type": "message", "role": "user", "content": f"Task #{index}: {history[0]['content']}"}
    items = [task, *history[1:]]
    return {"type": "response.create", **body, "input": items, "store": False, "stream_id": lane}


async def _open_batch(
    session: aiohttp.ClientSession, url: str, creates: list[dict[str, Any]]
) -> tuple[RawSocket, int, int]:
    """One socket, one create per lane; returns it with the raw bytes of tokens and items."""
    ws = await connect_ws(session, url)
    item_bytes = sum(len(ENCODER.encode(i)) for c in creates for i in c["input"])
    for create in creates:
        await ws.send_frame(ENCODER.encode(create), aiohttp.WSMsgType.TEXT)
    readers = {c["stream_id"]: RawTurnReader(now(), append=False) for c in creates}
    open_lanes, responses = set(readers), []
    while open_lanes:
        msg = await ws.receive()
        if msg.type is not aiohttp.WSMsgType.TEXT:
            raise BenchError(f"websocket closed while opening rollouts ({msg.type.name})")
        lane = msgspec.json.decode(msg.data, type=_Lane).stream_id
        reader = readers[lane]
        if reader.feed(msg.data, now()):
            turn = reader.turn
            if not turn.calls:
                raise BenchError("the model finished instead of calling a tool")
            responses.append(turn.response_id)
            item_bytes += sum(len(ENCODER.encode(i)) for i in turn.output)
            open_lanes.discard(lane)
    return ws, 4 * await _context_tokens(url, responses), item_bytes


async def _context_tokens(url: str, response_ids: list[str]) -> int:
    """Tokens the server holds for these rollouts (prompt + the absorbed tool call), by its own
    count (SPEC OBS-5; the bench's server runs with ``--bench-timings``)."""
    records = await fetch_timings(url)
    if records is None:
        raise BenchError("--memory needs a server started with --bench-timings")
    held = {r["response_id"]: r["context_tokens"] for r in records}
    return sum(held[response_id] for response_id in response_ids)


class _Lane(msgspec.Struct):
    stream_id: str = ""


def _raise_fd_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(needed, hard), hard))


async def run_memory(settings: MemorySettings, url: str | None = None) -> dict[str, Any]:
    if url is not None:
        raise BenchError("--memory reads the server's RSS, so it needs the bench's own server")
    lanes = max(1, min(settings.lanes, 32))
    connections = -(-settings.rollouts // lanes)
    _raise_fd_limit(connections * 2 + 256)  # inherited by the server subprocess
    connector = aiohttp.TCPConnector(limit=0)  # the default pool caps sockets at 100
    async with (
        ServerProcess(0.0, bench_timings=True) as server,
        aiohttp.ClientSession(connector=connector) as session,
    ):
        body, history = await build_history(server.url, settings.history_tokens)
        warm, _, _ = await _open_batch(session, server.url, [_create(body, history, -1, "warm")])
        await warm.close()
        rss_before = rss_bytes(server.pid)
        sockets, token_bytes, item_bytes, index = [], 0, 0, 0
        while index < settings.rollouts:
            batch = range(index, min(index + lanes, settings.rollouts))
            creates = [_create(body, history, i, f"lane-{i - index}") for i in batch]
            ws, tokens, items = await _open_batch(session, server.url, creates)
            sockets.append(ws)
            token_bytes, item_bytes, index = token_bytes + tokens, item_bytes + items, batch.stop
        rss_after = rss_bytes(server.pid)
        open_sessions = await _open_sessions(session, server.url)
        await asyncio.gather(*(ws.close() for ws in sockets))
    raw = token_bytes + item_bytes
    return {
        "rollouts": settings.rollouts,
        "connections": connections,
        "lanes_per_connection": lanes,
        "tokens_per_rollout": token_bytes / 4 / settings.rollouts,
        "rss_before": rss_before,
        "rss_after": rss_after,
        "rss_delta": rss_after - rss_before,
        "token_bytes": token_bytes,
        "item_bytes": item_bytes,
        "raw_bytes": raw,
        "rss_over_raw": (rss_after - rss_before) / raw,
        "rss_per_rollout": (rss_after - rss_before) / settings.rollouts,
        "open_sessions": open_sessions,
    }


async def _open_sessions(session: aiohttp.ClientSession, base_url: str) -> int:
    """The server's own count of open WebSocket sessions (read after RSS: it allocates)."""
    root = base_url.rsplit("/v1", 1)[0]
    async with session.get(f"{root}/debug/stats") as resp:
        stats = await resp.json()
    return int(stats.get("open_sessions", -1))
