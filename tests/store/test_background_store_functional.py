"""Background responses agree with the store (BG-10): when the terminal write fails, a poll, a
cancel and an SSE follower all learn that the response did not complete.

A real ``redis-server`` is the store. After the run is admitted (its ``in_progress`` record
written), the test revokes the ``SET`` command from the server's Redis user (``ACL SETUSER``),
so the terminal write fails at once with a real Redis error, and grants it back afterwards.
A scripted model with a gate holds the run until then.
"""

from __future__ import annotations

import asyncio
import signal
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import psycopg
import pytest
import redis.asyncio as aioredis
from openai import AsyncOpenAI

from engine.core import EngineConfig
from engine.models.base import TextDelta
from engine.models.router import Router
from engine.models.sim.scripted import ScriptedModel
from engine.server.transport.keys import BACKGROUND
from engine.store import ResponseStore
from engine.store.embedded.sqlite import SqliteStore
from engine.store.postgres import TABLE, PostgresStore
from engine.store.redis import RedisStore
from tests.store._procs import RedisServer
from tests.support.server import LiveServer, start_server
from tests.support.wait import wait_for


@pytest.fixture
async def gate() -> asyncio.Event:
    return asyncio.Event()


async def _serve(gate: asyncio.Event, store: ResponseStore) -> LiveServer:
    model = ScriptedModel([[TextDelta("Hello"), gate, TextDelta(" world")]])
    return await start_server(
        EngineConfig(tokens_per_second=0), Router(routes={}, default=model), store=store
    )


@pytest.fixture
async def live(redis_server: RedisServer, gate: asyncio.Event) -> AsyncIterator[LiveServer]:
    server = await _serve(gate, RedisStore(redis_server.url))
    try:
        yield server
    finally:
        await server.runner.cleanup()


async def _acl(admin: aioredis.Redis, rule: str) -> None:
    """Grant or revoke a command for the server's Redis user (``default``)."""
    command: Any = admin.execute_command  # redis-py leaves it untyped
    await command("ACL", "SETUSER", "default", rule)


async def _follow(url: str) -> list[dict[str, Any]]:
    """Every SSE event of a background stream, decoded, until the server ends it."""
    events = []
    async with aiohttp.ClientSession() as http, http.get(url) as resp:
        assert resp.status == 200
        async for line in resp.content:
            if line.startswith(b"data: "):
                events.append(msgspec.json.decode(line[6:]))
    return events


async def test_a_failed_terminal_write_is_failed_everywhere(
    live: LiveServer, redis_server: RedisServer, gate: asyncio.Event
) -> None:
    client = AsyncOpenAI(base_url=live.base_url, api_key="x", max_retries=0)
    admin = aioredis.Redis.from_url(redis_server.url)
    try:
        created = await client.responses.create(model="m", input="hi", background=True)
        follower = asyncio.create_task(
            _follow(f"{live.base_url}/responses/{created.id}?stream=true")
        )
        polled = await client.responses.retrieve(created.id)
        while polled.status == "queued":  # opens at the first delta
            await asyncio.sleep(0.01)
            polled = await client.responses.retrieve(created.id)
        await _acl(admin, "-set")
        gate.set()
        events = await asyncio.wait_for(follower, 30)
        # The follower sees the store's refusal, not a silent end (nor a completion).
        assert events[-1]["type"] == "error"
        assert events[-1]["error"]["code"] == "store_unavailable"
        assert all(e["type"] != "response.completed" for e in events)
        # A poll and a cancel report it failed, never completed (before and after the store
        # takes writes again, in this process).
        failed = await client.responses.retrieve(created.id)
        assert failed.status == "failed" and failed.error is not None
        await _acl(admin, "+set")
        cancelled = await client.responses.cancel(created.id)
        assert cancelled.status == "failed"
        again = await client.responses.retrieve(created.id)
        assert again.status == "failed"
        # ... and the store agrees once it takes writes: the failed record is durable.
        record = await live.engine.store.get(created.id)
        assert record is not None and record.response.status == "failed"
    finally:
        await _acl(admin, "+set")
        await admin.aclose()
        await client.close()


async def test_a_cancel_during_the_terminal_write_leaves_it_stored(
    live: LiveServer, redis_server: RedisServer, gate: asyncio.Event
) -> None:
    """STORE-21, BG-6: a cancel that lands while the terminal record is being written (Redis
    stopped with SIGSTOP mid-write) does not abandon the write: once Redis runs again the
    response is completed and stored, and the cancel answers what the store holds."""
    client = AsyncOpenAI(base_url=live.base_url, api_key="x", max_retries=0)
    try:
        created = await client.responses.create(model="m", input="hi", background=True)
        run = live.runner.app[BACKGROUND].live[created.id]
        await wait_for(lambda: run.snapshot().status == "in_progress", "the first delta")
        assert redis_server.proc is not None
        redis_server.proc.send_signal(signal.SIGSTOP)
        try:
            gate.set()  # the model finishes; the terminal write now waits on a stopped Redis
            assert run.turn is not None
            await wait_for(lambda: run.turn.status == "completed", "the terminal write to begin")
            cancel = asyncio.create_task(client.responses.cancel(created.id))
            assert run.task is not None
            await wait_for(lambda: run.task.cancelling() > 0, "the cancel to reach the run")
        finally:
            redis_server.proc.send_signal(signal.SIGCONT)
        answered = await asyncio.wait_for(cancel, 30)
        assert answered.status in ("completed", "cancelled")
        record = await live.engine.store.get(created.id)
        assert record is not None and record.response.status == answered.status
        assert answered.status == "completed"  # the write it was in the middle of finished
    finally:
        await client.close()


async def test_a_cancel_during_a_blocked_postgres_write_still_stores_it(
    postgres_url: str, gate: asyncio.Event
) -> None:
    """STORE-21 on Postgres, where a cancelled caller would also cancel its statement on the
    server: another transaction holds the table locked while the terminal upsert waits, the
    cancel lands, then the lock is released. The upsert finishes: completed and stored."""
    live = await _serve(gate, PostgresStore(postgres_url))
    client = AsyncOpenAI(base_url=live.base_url, api_key="x", max_retries=0)
    blocker = await psycopg.AsyncConnection.connect(postgres_url)
    try:
        created = await client.responses.create(model="m", input="hi", background=True)
        run = live.runner.app[BACKGROUND].live[created.id]
        await wait_for(lambda: run.snapshot().status == "in_progress", "the first delta")
        await blocker.execute(f"LOCK TABLE {TABLE} IN EXCLUSIVE MODE")  # its transaction stays open
        gate.set()
        assert run.turn is not None and run.task is not None
        await wait_for(lambda: run.turn.status == "completed", "the terminal write to begin")
        cancel = asyncio.create_task(client.responses.cancel(created.id))
        await wait_for(lambda: run.task.cancelling() > 0, "the cancel to reach the run")
        await blocker.rollback()  # the lock goes; the upsert proceeds
        answered = await asyncio.wait_for(cancel, 30)
        record = await live.engine.store.get(created.id)
        assert record is not None and record.response.status == answered.status == "completed"
    finally:
        await blocker.close()
        await client.close()
        await live.runner.cleanup()


async def test_fuzz_seed_1538568222_cancel_racing_an_incomplete_end_on_sqlite(
    tmp_path: Path, gate: asyncio.Event
) -> None:
    """Regression (the HTTP fuzzer, seed 1538568222, race-dependent so not replayable): a cancel
    answered ``incomplete`` while a poll read ``queued`` from the store. Here deterministically:
    the response ends while another connection holds SQLite's write lock, so the terminal
    write waits in the store's thread when the cancel lands. Cancel and poll must agree with
    the store (STORE-21, BG-6)."""
    store = SqliteStore(tmp_path / "race.db")
    live = await _serve(gate, store)
    client = AsyncOpenAI(base_url=live.base_url, api_key="x", max_retries=0)
    try:
        created = await client.responses.create(
            model="m", input="hi", background=True, max_output_tokens=1
        )
        run = live.runner.app[BACKGROUND].live[created.id]
        await wait_for(lambda: run.snapshot().status == "in_progress", "the first delta")
        holder = sqlite3.connect(store.path, isolation_level=None, check_same_thread=False)
        holder.execute("BEGIN IMMEDIATE")
        try:
            gate.set()
            assert run.turn is not None and run.task is not None
            ended = ("completed", "incomplete")
            await wait_for(lambda: run.turn.status in ended, "the terminal write to begin")
            cancel = asyncio.create_task(client.responses.cancel(created.id))
            await wait_for(lambda: run.task.cancelling() > 0, "the cancel to reach the run")
        finally:
            holder.execute("COMMIT")
            holder.close()
        answered = await asyncio.wait_for(cancel, 30)
        polled = await client.responses.retrieve(created.id)
        record = await live.engine.store.get(created.id)
        assert record is not None
        assert answered.status == polled.status == record.response.status
        assert record.response.status in ("completed", "incomplete")  # the write it was in
    finally:
        await client.close()
        await live.runner.cleanup()
