"""ROLL-9: a finished rollout and the request state around it are freed by reference counting
alone, and ``rollout serve`` freezes its startup heap once it listens.

With the cyclic collector off, every object a turn leaves in a reference cycle stays in
``gc.get_objects()``; after the turns below (HTTP ``previous_response_id`` with a tool round
trip, an HTTP error, a failed rollout, WebSocket standard and append mode) none of the per-turn
objects may remain.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import logging
import re
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any

import aiohttp
import openai
import pytest

from engine.connection.lane import Lane
from engine.connection.session import Session
from engine.models.base import CallEnd, CallStart, Finish, TextDelta
from engine.models.router import Router
from engine.models.sim.scripted import ScriptedModel
from engine.rollout.coroutine import Rollout
from engine.rollout.endings import Endings
from engine.rollout.turn import Turn
from tests.support.fixtures import sdk_client
from tests.support.server import LiveServer, free_port
from tests.support.wait import wait_for, wait_healthy
from tests.support.ws import read_until

TOOL = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}
PER_TURN = (Rollout, Endings, Turn, Session, Lane)


def _call(call_id: str) -> list[Any]:
    return [CallStart(call_id, "f"), CallEnd(), Finish("tool_calls", 1)]


def _alive() -> collections.Counter[str]:
    return collections.Counter(type(o).__name__ for o in gc.get_objects() if type(o) in PER_TURN)


@pytest.fixture
def no_collector() -> Iterator[None]:
    """The cyclic collector off, and the server's log silent: pytest's capture keeps every
    record, and a logged fault's traceback holds its frames (the server's own handler, the
    inspector's, keeps only the message, INSP-6)."""
    logger = logging.getLogger("rollout")
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect()
        logger.setLevel(level)


async def _quiet(live: LiveServer) -> None:
    """Every rollout task and lane worker has ended."""

    def idle() -> bool:
        names = [t.get_name() for t in asyncio.all_tasks()]
        return not any(n.startswith(("rollout_", "lane:")) for n in names)

    await wait_for(idle, "the rollouts to end")


async def _http_turns(live: LiveServer) -> None:
    async with sdk_client(live) as sdk:
        first = await sdk.responses.create(model="m", input="go", tools=[TOOL])
        output = {"type": "function_call_output", "call_id": "call_h", "output": "r" * 1500}
        second = await sdk.responses.create(
            model="m",
            input=[output],
            previous_response_id=first.id,
            tools=[TOOL],
        )
        assert second.output_text == "done"
        with pytest.raises(openai.BadRequestError):  # a request-scoped failure (HTTP error path)
            await sdk.responses.create(model="m", input="x", previous_response_id="resp_nope")
        with pytest.raises(openai.InternalServerError):  # a failed rollout (ROLL-8)
            await sdk.responses.create(model="m", input="fail")


async def _ws_turns(live: LiveServer) -> None:
    async with aiohttp.ClientSession() as http, http.ws_connect(live.ws_url) as ws:
        create = {"type": "response.create", "input": "go", "tools": [TOOL], "store": False}
        await ws.send_json(create)
        first = (await read_until(ws, "response.completed"))[-1]["response"]
        output = {"type": "function_call_output", "call_id": "call_s", "output": "r"}
        await ws.send_json({**create, "input": [output], "previous_response_id": first["id"]})
        await read_until(ws, "response.completed")
        await ws.send_json({**create, "rollout_mode": "append"})
        done = (await read_until(ws, "response.done"))[-1]["response"]
        answer = {"type": "function_call_output", "call_id": "call_a", "output": "r"}
        append = {"type": "response.append", "response_id": done["id"], "input": [answer]}
        await ws.send_json(append)
        await read_until(ws, "response.completed")


async def test_finished_turns_leave_nothing_for_the_cyclic_collector(
    server_factory: Callable[..., Any], no_collector: None
) -> None:
    model = ScriptedModel(
        [
            _call("call_h"), [TextDelta("done")],  # HTTP, previous_response_id
            [TextDelta("par"), RuntimeError("boom")],  # HTTP, a failed rollout
            _call("call_s"), [TextDelta("ok")],  # WebSocket, standard mode
            _call("call_a"), [TextDelta("ok")],  # WebSocket, append mode
        ]
    )  # fmt: skip
    live: LiveServer = await server_factory(router=Router(routes={}, default=model))
    before = _alive()
    await _http_turns(live)
    await _ws_turns(live)
    await _quiet(live)
    assert len(model.requests) == 7
    for step in (step for turn in model.turns for step in turn):
        if isinstance(step, BaseException):  # the script's own exception holds its traceback's
            step.__traceback__ = None  # frames: a reference the test made, not the server
    assert _alive() == before  # ROLL-9: each one went with its last reference


async def test_serve_freezes_its_startup_heap_once_it_listens() -> None:
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cli", "serve", "--port", str(port), "--store", "memory://",
        "--log-level", "INFO", stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        await wait_healthy(f"http://127.0.0.1:{port}/healthz", "the server to start")
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 20) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.stderr is not None
    log = (await proc.stderr.read()).decode()
    frozen = re.search(r"startup heap frozen: (\d+) objects", log)
    assert frozen is not None, log
    assert int(frozen.group(1)) > 10_000  # the modules, codecs and tables startup built
