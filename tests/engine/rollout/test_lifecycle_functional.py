"""Rollout lifecycle on a real server: failures, idle limits, disconnects (ROLL-*, WS-*, LIM-*)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import aiohttp

from engine.core import EngineConfig
from engine.models.base import CallEnd, CallStart, Finish, TextDelta
from engine.models.router import Router
from engine.models.sim.scripted import ScriptedModel
from tests.support.server import LiveServer
from tests.support.wait import wait_for
from tests.support.ws import read_until

TOOL = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}
CALL_TURN = [CallStart("call_1", "f"), CallEnd(), Finish("tool_calls", 1)]


def _rollout_tasks() -> list[asyncio.Task[Any]]:
    """The coroutines of live rollouts (their tasks are named by the rollout id)."""
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("rollout_")]


def _router(*turns: list[Any]) -> Router:
    model = ScriptedModel(turns)
    return Router(routes={}, default=model)


async def test_backend_failure_is_response_failed_and_socket_survives(
    server_factory: Callable[..., Any],
) -> None:
    router = _router([TextDelta("par"), RuntimeError("secret internal detail")], [TextDelta("ok")])
    live: LiveServer = await server_factory(router=router)
    async with aiohttp.ClientSession() as http, http.ws_connect(live.ws_url) as ws:
        await ws.send_json({"type": "response.create", "input": "hi"})
        events = await read_until(ws, "response.failed", "response.completed", "error")
        failed = events[-1]
        assert failed["type"] == "response.failed"
        assert failed["response"]["error"]["code"] == "server_error"
        assert "secret" not in json.dumps(events)  # ERR-3
        assert failed["response"]["output"][0]["status"] == "incomplete"  # ORD-8
        await ws.send_json({"type": "response.create", "input": "again"})
        events = await read_until(ws, "response.completed")
        assert events[-1]["response"]["output"][0]["content"][0]["text"] == "ok"


async def test_failed_continuation_evicts_parent(server_factory: Callable[..., Any]) -> None:
    live: LiveServer = await server_factory(router=_router(CALL_TURN, [RuntimeError("x")]))
    async with aiohttp.ClientSession() as http, http.ws_connect(live.ws_url) as ws:
        await ws.send_json(
            {"type": "response.create", "input": "hi", "tools": [TOOL], "store": False}
        )
        first = (await read_until(ws, "response.completed"))[-1]["response"]
        output = {"type": "function_call_output", "call_id": "call_1", "output": "r"}
        continuation = {
            "type": "response.create",
            "previous_response_id": first["id"],
            "input": [output],
            "tools": [TOOL],
            "store": False,
        }
        await ws.send_json(continuation)
        assert (await read_until(ws, "response.failed"))[-1]["type"] == "response.failed"
        await ws.send_json(continuation)  # CACHE-3: the parent is gone
        error = (await read_until(ws, "error"))[-1]
        assert error["error"]["code"] == "previous_response_not_found"
        assert error["status"] == 400 and error["error"]["param"] == "previous_response_id"


async def test_append_idle_timeout_ends_incomplete(server_factory: Callable[..., Any]) -> None:
    config = EngineConfig(tokens_per_second=0, suspended_idle_timeout_s=0.2)
    live: LiveServer = await server_factory(config, router=_router(CALL_TURN))
    async with aiohttp.ClientSession() as http, http.ws_connect(live.ws_url) as ws:
        await ws.send_json(
            {"type": "response.create", "input": "hi", "tools": [TOOL], "rollout_mode": "append"}
        )
        events = await read_until(ws, "response.incomplete")
        types = [e["type"] for e in events]
        assert types.count("response.done") == 1
        reason = events[-1]["response"]["incomplete_details"]["reason"]
        assert reason == "idle_timeout"
        assert [e["sequence_number"] for e in events] == list(range(len(events)))


async def test_compat_idle_rollout_still_continues_from_cache(
    server_factory: Callable[..., Any],
) -> None:
    """An idle suspended coroutine is retired, but its context stays cached (COMPAT-3)."""
    config = EngineConfig(tokens_per_second=0, suspended_idle_timeout_s=0.1)
    live: LiveServer = await server_factory(config, router=_router(CALL_TURN, [TextDelta("done")]))
    async with aiohttp.ClientSession() as http, http.ws_connect(live.ws_url) as ws:
        await ws.send_json(
            {"type": "response.create", "input": "hi", "tools": [TOOL], "store": False}
        )
        first = (await read_until(ws, "response.completed"))[-1]["response"]
        # Past its idle timeout (ROLL-6) the suspended coroutine is retired: its task ends.
        await wait_for(lambda: not _rollout_tasks(), "the idle rollout to be retired")
        output = {"type": "function_call_output", "call_id": "call_1", "output": "r"}
        await ws.send_json(
            {
                "type": "response.create",
                "previous_response_id": first["id"],
                "input": [output],
                "store": False,
            }
        )
        final = (await read_until(ws, "response.completed"))[-1]["response"]
        assert final["output"][0]["content"][0]["text"] == "done"
    assert live.engine.counters["create.cache_hit"] == 1
    assert live.engine.counters["create.fast_path"] == 0


async def test_connection_age_limit(server_factory: Callable[..., Any]) -> None:
    live: LiveServer = await server_factory(
        EngineConfig(tokens_per_second=0, max_connection_age_s=0)
    )
    async with aiohttp.ClientSession() as http, http.ws_connect(live.ws_url) as ws:
        await asyncio.sleep(0.01)  # time itself: the connection outlives its 0 s age limit
        await ws.send_json({"type": "response.create", "input": "hi"})
        error = (await read_until(ws, "error"))[-1]
        assert error["error"]["code"] == "websocket_connection_limit_reached"
        assert error["status"] == 400 and "param" in error["error"]


async def test_disconnect_mid_stream_leaves_nothing_running(
    server_factory: Callable[..., Any],
) -> None:
    router = _router([TextDelta("a"), 30.0, TextDelta("never")])
    live: LiveServer = await server_factory(router=router)
    baseline = len(asyncio.all_tasks())
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(live.ws_url)
        await ws.send_json({"type": "response.create", "input": "hi", "store": True})
        events = await read_until(ws, "response.output_text.delta")
        response_id = events[0]["response"]["id"]
        await ws.close()
    # the server notices the close asynchronously
    await wait_for(lambda: len(asyncio.all_tasks()) <= baseline, "the rollout's tasks to end")
    record = await live.engine.store.get(response_id)
    assert record is not None and record.response.status == "cancelled"  # never in_progress
    await live.engine.post.stop()
    assert live.engine.post.runs == 1  # usage for the cancelled rollout was still accounted
