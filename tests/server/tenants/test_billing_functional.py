"""Nothing billed is lost (POST-1, POST-5): a response that produced output gets exactly one
ledger record, whatever happens to the client during its terminal sequence.

A real server on a real SQLite store, real client sockets: the ``websockets`` client (the one
the openai SDK uses) cut with a TCP abort, and the openai SDK's SSE stream closed mid-stream.
The test holds SQLite's write lock (another connection's ``BEGIN IMMEDIATE``, as a second
writer would), so the server's durable write (STORE-6) waits exactly where the terminal
sequence is cut: every event before ``response.completed`` has been sent, the terminal frame
has not. The client leaves at each point of that sequence.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI
from websockets.asyncio.client import connect

from engine.core import EngineConfig
from engine.store.embedded.sqlite import SqliteStore
from tests.support.server import LiveServer

MODEL = "sim"
PROMPT = "Tell me about the weather in Paris."
# The end of a text response, the last delta first; the store write comes before the last.
TERMINAL = [
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


@pytest.fixture
async def stored(server_factory: Callable[..., Any], tmp_path: Path) -> LiveServer:
    store = SqliteStore(tmp_path / "billing.db")
    live: LiveServer = await server_factory(EngineConfig(tokens_per_second=0), store=store)
    return live


class WriteLock:
    """SQLite's write lock, held by a second connection until released."""

    def __init__(self, path: Path) -> None:
        self._conn = sqlite3.connect(path, isolation_level=None, timeout=0)
        self._conn.execute("BEGIN IMMEDIATE")

    def release(self) -> None:
        self._conn.execute("ROLLBACK")
        self._conn.close()


def _records_of(live: LiveServer, response_id: str) -> int:
    return sum(response_id in record.response_ids for record in live.engine.post.recent)


async def _until(condition: Callable[[], bool]) -> None:
    """What the server does after a client leaves lands a moment later: wait for it."""
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition never held")


def _cut_index(point: str, types: list[str]) -> int:
    """Where ``point`` is in a response's event types: the last delta, or the event itself."""
    if point == "response.output_text.delta":
        return max(i for i, kind in enumerate(types) if kind == point)
    return types.index(point)


async def _ws_types(live: LiveServer) -> list[str]:
    """A full reference turn (the simulator is deterministic): its event types in order."""
    async with connect(live.ws_url) as ws:
        await ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": PROMPT}))
        types: list[str] = []
        while not types or types[-1] != "response.completed":
            types.append(json.loads(await ws.recv())["type"])
    return types


async def _ws_cut_at(live: LiveServer, index: int) -> str:
    """A ``store: true`` turn whose socket is aborted right after event ``index``."""
    ws = await connect(live.ws_url)
    await ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": PROMPT}))
    response_id = ""
    for _ in range(index + 1):
        event = json.loads(await ws.recv())
        response_id = response_id or event["response"]["id"]
    assert ws.transport is not None
    ws.transport.abort()  # no close frame: the TCP connection is cut
    await ws.wait_closed()
    return response_id


@pytest.mark.parametrize("point", TERMINAL)
async def test_ws_cut_during_the_terminal_sequence_is_billed_once(
    stored: LiveServer, tmp_path: Path, point: str
) -> None:
    """POST-5 over WebSocket: the socket is cut after each event of the terminal sequence while
    the durable write waits; the response is billed exactly once, before the write finishes
    (the cancelled rollout hands its record over at once), and it is stored."""
    index = _cut_index(point, await _ws_types(stored))
    lock = WriteLock(tmp_path / "billing.db") if point != "response.completed" else None
    try:
        response_id = await _ws_cut_at(stored, index)
        await _until(lambda: _records_of(stored, response_id) == 1)
    finally:
        if lock is not None:
            lock.release()
    await stored.runner.cleanup()  # drains post-inference and the store's queued writes
    assert _records_of(stored, response_id) == 1
    reopened = SqliteStore(tmp_path / "billing.db")
    await reopened.open()
    try:
        kept = await reopened.get(response_id)
    finally:
        await reopened.close()
    assert kept is not None and kept.response.status == "completed"


async def _sse_cut_at(client: AsyncOpenAI, point: str, index: int) -> str:
    """An SSE stream the SDK closes right after event ``index`` (of type ``point``)."""
    stream = await client.responses.create(model=MODEL, input=PROMPT, stream=True)
    response_id = ""
    seen = 0
    async for event in stream:
        if event.type == "response.created":
            response_id = event.response.id
        if seen == index:
            assert event.type == point
            break
        seen += 1
    await stream.close()  # the connection is closed, the rest of the stream unread
    return response_id


@pytest.mark.parametrize("point", TERMINAL)
async def test_sse_cut_during_the_terminal_sequence_is_billed_once(
    stored: LiveServer, tmp_path: Path, point: str
) -> None:
    """POST-5 over HTTP: the SDK closes the stream after each event of the terminal sequence
    while the durable write waits; once it is written the terminal frame finds the client
    gone, and the response is still billed exactly once."""
    client = AsyncOpenAI(base_url=stored.base_url, api_key="x", max_retries=0)
    try:
        stream = await client.responses.create(model=MODEL, input=PROMPT, stream=True)
        index = _cut_index(point, [event.type async for event in stream])
        lock = WriteLock(tmp_path / "billing.db") if point != "response.completed" else None
        try:
            response_id = await _sse_cut_at(client, point, index)
        finally:
            if lock is not None:
                lock.release()
        await _until(lambda: _records_of(stored, response_id) == 1)
        assert (await client.responses.retrieve(response_id)).status == "completed"
    finally:
        await client.close()
    await stored.runner.cleanup()
    assert _records_of(stored, response_id) == 1
