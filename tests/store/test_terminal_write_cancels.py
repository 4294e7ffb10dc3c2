"""The terminal write outlasts every cancel (STORE-30, STORE-21): a retried cancel, a DELETE
after a cancel and shutdown after a cancel each land while the terminal record is being
written to a real PostgreSQL whose table another transaction holds locked, and the write
still finishes once the lock goes.

Postgres is the backend that tells: a statement whose caller is cancelled is cancelled on the
server too (psycopg sends the cancel request), so an abandoned write never lands and the store
keeps the ``in_progress`` record written at admission. (Redis does not tell: a command already
sent runs even after its client closed the connection.) A scripted model with a gate holds
the run until the table is locked.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import psycopg
import pytest
from openai import AsyncOpenAI

from engine.connection.background import BackgroundRun
from engine.core import EngineConfig
from engine.models.base import TextDelta
from engine.models.router import Router
from engine.models.sim.scripted import ScriptedModel
from engine.server.transport.keys import BACKGROUND
from engine.server.transport.server_config import ServerConfig
from engine.store.postgres import TABLE, PostgresStore
from engine.store.records import _decode
from tests.support.server import LiveServer, start_server
from tests.support.wait import wait_for


@pytest.fixture
async def gate() -> asyncio.Event:
    return asyncio.Event()


@pytest.fixture
async def live(postgres_url: str, gate: asyncio.Event) -> AsyncIterator[LiveServer]:
    model = ScriptedModel([[TextDelta("Hello"), gate, TextDelta(" world")]])
    server = await start_server(
        EngineConfig(tokens_per_second=0),
        Router(routes={}, default=model),
        store=PostgresStore(postgres_url),
        server=ServerConfig(shutdown_grace_s=0.0),  # shutdown cancels the run at once
    )
    try:
        yield server
    finally:
        await server.runner.cleanup()  # a second cleanup (the shutdown test's) is a no-op


async def _write_held_with(
    live: LiveServer,
    postgres_url: str,
    gate: asyncio.Event,
    then: Callable[[BackgroundRun], Awaitable[Any]],
) -> tuple[str, Any, Any]:
    """A background run whose terminal write waits on a locked table, cancelled once over
    HTTP and then hit by ``then(run)`` while the write still waits. Returns the response id
    and both outcomes, after the lock went."""
    client = AsyncOpenAI(base_url=live.base_url, api_key="x", max_retries=0)
    blocker = await psycopg.AsyncConnection.connect(postgres_url)
    try:
        created = await client.responses.create(model="m", input="hi", background=True)
        run = live.runner.app[BACKGROUND].live[created.id]
        await wait_for(lambda: run.snapshot().status == "in_progress", "the first delta")
        assert run.task is not None
        await blocker.execute(f"LOCK TABLE {TABLE} IN EXCLUSIVE MODE")  # its transaction stays open
        try:
            gate.set()  # the model finishes; the terminal upsert now waits for the lock
            assert run.turn is not None
            await wait_for(lambda: run.turn.status == "completed", "the terminal write to begin")
            first = asyncio.create_task(client.responses.cancel(created.id))
            await wait_for(lambda: run.task.cancelling() == 1, "the first cancel to land")
            second: asyncio.Task[Any] = asyncio.create_task(then(run))
            await wait_for(lambda: run.task.cancelling() == 2, "the second cancel to land")
        finally:
            await blocker.rollback()  # the lock goes; the upsert, if still asked for, proceeds
        outcomes = await asyncio.wait_for(asyncio.gather(first, second, return_exceptions=True), 30)
        return created.id, outcomes[0], outcomes[1]
    finally:
        await blocker.close()
        await client.close()


async def _stored_status(postgres_url: str, response_id: str) -> str:
    """The status in the stored record, read raw: a tombstone (STORE-11) keeps the status of
    the record it replaced."""
    store = PostgresStore(postgres_url)
    await store.open()
    try:
        blob = await store._read_one(response_id)
        assert blob is not None, "no record at all"
        return _decode(response_id, blob).response.status
    finally:
        await store.close()


async def test_a_retried_cancel_does_not_abandon_the_terminal_write(
    live: LiveServer, postgres_url: str, gate: asyncio.Event
) -> None:
    """STORE-30: the client's cancel times out and is sent again; both land mid-write."""
    client = AsyncOpenAI(base_url=live.base_url, api_key="x", max_retries=0)

    async def cancel_again(run: BackgroundRun) -> Any:
        return await client.responses.cancel(run.response.id)

    try:
        response_id, first, second = await _write_held_with(live, postgres_url, gate, cancel_again)
    finally:
        await client.close()
    assert first.status == second.status == "completed"  # the write they landed in finished
    assert await _stored_status(postgres_url, response_id) == "completed"
    stored = await live.engine.store.get(response_id)
    assert stored is not None and stored.response.status == "completed"


async def test_a_delete_after_a_cancel_does_not_abandon_the_terminal_write(
    live: LiveServer, postgres_url: str, gate: asyncio.Event
) -> None:
    """STORE-30: DELETE cancels the run again (BG-9) while the first cancel's write waits;
    the write finishes first, then the record becomes a tombstone of the completed one."""

    async def delete(run: BackgroundRun) -> Any:
        url = f"{live.base_url}/responses/{run.response.id}"
        async with aiohttp.ClientSession() as http, http.delete(url) as resp:
            return resp.status, await resp.json()

    response_id, first, (status, body) = await _write_held_with(live, postgres_url, gate, delete)
    assert first.status == "completed"
    assert status == 200 and body["deleted"] is True
    assert await live.engine.store.get(response_id) is None  # deleted, as asked
    # ... after the terminal record was written: the tombstone replaced a completed record.
    assert await _stored_status(postgres_url, response_id) == "completed"


async def test_shutdown_after_a_cancel_does_not_abandon_the_terminal_write(
    live: LiveServer, postgres_url: str, gate: asyncio.Event
) -> None:
    """STORE-30: shutdown (no grace) cancels the run again while the first cancel's write
    waits; the node stops only after the write finished."""

    async def shut_down(run: BackgroundRun) -> None:
        await live.runner.cleanup()

    response_id, _first, stopped = await _write_held_with(live, postgres_url, gate, shut_down)
    assert stopped is None  # the shutdown itself went through
    # The cancel's own answer may be lost with the stopping node; the store is what counts.
    assert await _stored_status(postgres_url, response_id) == "completed"
