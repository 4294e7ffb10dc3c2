"""HttpClient against a real server: SSE streams, ``previous_response_id`` or stateless."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from clients.coding import SCENARIO_PROMPT, coding_tools
from clients.exceptions import ApiError, ConnectionFailed
from clients.http import HttpClient
from clients.loop import Hooks
from clients.toolbox import ToolRegistry
from protocol import events as ev
from tests.clients.conftest import assert_scenario_completed
from tests.support.server import LiveServer, serve_app

MODEL = "sim-coding-agent"


async def test_scenario_with_previous_response_id(server: LiveServer, sandbox: Path) -> None:
    events: list[ev.ServerEvent] = []
    connections: list[object] = []  # the server's connections seen while events arrived

    def on_event(event: ev.ServerEvent) -> None:
        events.append(event)
        connections.extend(c for c in server.runner.server.connections if c not in connections)

    async with HttpClient(server.base_url, hooks=Hooks(on_event=on_event)) as client:
        result = await client.run(MODEL, SCENARIO_PROMPT, coding_tools(sandbox))
    assert_scenario_completed(result, sandbox)
    # Each stream is read to its end, so the 27 requests share one pooled connection (a
    # response left with its body unread would close it: a new connection every turn).
    assert len(connections) == 1
    assert len(set(result.response_ids)) == 27
    assert sum(isinstance(e, ev.ResponseCompleted) for e in events) == 27
    # Each continuation named its parent by id; nothing was resent, and each resumed the
    # chain's parked rollout (PARK-4, PARK-3): pre-inference only over its new items.
    assert server.engine.counters["create.unparked"] == 26
    assert server.engine.counters["create.hydrated"] == 0
    assert server.engine.counters["create.store_hydrate"] == 0
    assert server.engine.counters["create.stateless"] == 1
    last = await server.engine.store.get(result.response_id)
    assert last is not None and last.response.previous_response_id == result.response_ids[-2]


async def test_a_stream_whose_end_comes_late_is_still_read_to_it(server: LiveServer) -> None:
    """clients (README's HttpClient): the engine sends a stream's last frames and its end in one
    write (HTTP-8), so a client that stopped at the terminal event would still find the end
    read. Here a relay holds each stream's end until the client has seen the terminal event:
    only a client that reads on to the end keeps its one keep-alive connection."""
    seen_terminal = asyncio.Event()
    peers: set[object] = set()

    async def relay(request: web.Request) -> web.StreamResponse:
        peers.add(request.transport.get_extra_info("peername") if request.transport else None)
        seen_terminal.clear()
        body, kind = await request.read(), {"Content-Type": "application/json"}
        url = f"{server.base_url}/responses"
        async with aiohttp.ClientSession() as http, http.post(url, data=body, headers=kind) as up:
            stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await stream.prepare(request)
            async for chunk in up.content.iter_any():
                await stream.write(chunk)
        await seen_terminal.wait()  # the client has the terminal event; the end comes now
        await stream.write_eof()
        return stream

    app = web.Application()
    app.router.add_post("/v1/responses", relay)
    runner, port = await serve_app(app)

    def on_event(event: ev.ServerEvent) -> None:
        if isinstance(event, ev.ResponseCompleted):
            seen_terminal.set()

    try:
        hooks = Hooks(on_event=on_event)
        async with HttpClient(f"http://127.0.0.1:{port}/v1", hooks=hooks, timeout=30) as client:
            for _ in range(3):
                await client.run("sim", "hi", ToolRegistry())
    finally:
        await runner.cleanup()
    assert len(peers) == 1, peers  # one connection for the three requests


async def test_stateless_scenario_resends_full_history(server: LiveServer, sandbox: Path) -> None:
    async with HttpClient(server.base_url, stateless=True) as client:
        result = await client.run(MODEL, SCENARIO_PROMPT, coding_tools(sandbox), store=False)
    assert_scenario_completed(result, sandbox)
    assert server.engine.counters["create.stateless"] == 27
    assert server.engine.counters["create.store_hydrate"] == 0


async def test_http_error_status_raises_api_error(server: LiveServer) -> None:
    async with HttpClient(server.base_url) as client:
        with pytest.raises(ApiError) as info:
            await client.run("sim", "hi", ToolRegistry(), rollout_mode="append")
    assert (info.value.status, info.value.code, info.value.param) == (
        400,
        "unsupported_parameter",
        "rollout_mode",
    )


async def test_unreachable_server_raises_connection_failed(unused_port: int) -> None:
    async with HttpClient(f"http://127.0.0.1:{unused_port}/v1") as client:
        with pytest.raises(ConnectionFailed, match="cannot reach"):
            await client.run("sim", "hi", ToolRegistry())
