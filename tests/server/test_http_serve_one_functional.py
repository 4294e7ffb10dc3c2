"""HTTP-9: an HTTP create is served in its request's own task: while its response is being
produced the process runs no lane worker for it (the WebSocket's lanes keep theirs, WS-5), and
its request-scoped errors still become the answer (ERR-2)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp

from engine.core import EngineConfig
from tests.support.server import LiveServer


def _lane_workers() -> set[asyncio.Task[object]]:
    return {t for t in asyncio.all_tasks() if t.get_name().startswith("lane:")}


async def test_an_http_create_runs_no_lane_worker(server_factory: Callable[..., Any]) -> None:
    live: LiveServer = await server_factory(EngineConfig(tokens_per_second=200))
    body = {"model": "sim", "input": "Write a long story.", "stream": True}
    before = _lane_workers()  # any other server's in this process: not this request's
    seen: list[set[asyncio.Task[object]]] = []
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{live.base_url}/responses", json=body) as resp:
            assert resp.status == 200
            async for line in resp.content:
                if line.startswith(b"event: response.output_text.delta"):
                    seen.append(_lane_workers() - before)  # mid-response
            assert line  # read to the end
        assert seen and all(not workers for workers in seen)
        # the WebSocket keeps its lane worker (WS-5): the check above can see one
        async with http.ws_connect(live.ws_url) as ws:
            await ws.send_json({"type": "response.create", "model": "sim", "input": "hi"})
            while (await ws.receive_json())["type"] != "response.completed":
                pass
            assert [t.get_name() for t in _lane_workers() - before] == ["lane:None"]


async def test_errors_of_an_http_create_are_its_answer(server: LiveServer) -> None:
    async with aiohttp.ClientSession() as http:
        body = {"model": "sim", "input": "hi", "previous_response_id": "resp_unknown"}
        async with http.post(f"{server.base_url}/responses", json=body) as resp:
            assert resp.status == 400
            error = (await resp.json())["error"]
            assert error["code"] == "previous_response_not_found"
            assert error["param"] == "previous_response_id"
