"""``rollout serve --workers 2`` end to end (WORK-1..WORK-4): a real parent process, two real
workers on one port, real clients on fresh connections, SIGTERM to the parent."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from engine.server.process.workers import worker_argv
from tests.support.server import stdout_port
from tests.support.wait import wait_for

TOOLS: list[Any] = [
    {"type": "function", "name": "read_file", "parameters": {"type": "object", "properties": {}}}
]


async def _stats(port: int) -> dict[str, Any]:
    """``/debug/stats`` over a fresh connection, so the kernel may pick either worker."""
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http,
        http.get(f"http://127.0.0.1:{port}/debug/stats") as resp,
    ):
        assert resp.status == 200
        data: dict[str, Any] = await resp.json()
        return data


@pytest.fixture(params=["memory://"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The workers' ``--store``: memory (per process) unless a test asks for a shared file."""
    url: str = request.param
    return f"sqlite:///{tmp_path / 'shared.db'}" if url == "sqlite" else url


@pytest.fixture
async def pool(store_url: str) -> AsyncIterator[tuple[int, asyncio.subprocess.Process]]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cli", "serve", "--port", "0", "--announce-port",
        "--workers", "2", "--tps", "0", "--log-level", "WARNING", "--store", store_url,
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        port = await stdout_port(proc, 60)  # the pool's one port, picked by the parent (WORK-1)
        for _ in range(8):  # announced once every worker listens: no retry needed (WORK-1)
            await _stats(port)
        await _worker_views(port)
        yield port, proc
    finally:
        if proc.returncode is None:
            proc.kill()  # the workers follow their parent (WORK-2)
            await proc.wait()


async def _worker_views(port: int, want: int = 2) -> dict[int, dict[str, Any]]:
    """The latest ``/debug/stats`` of each worker, polled until ``want`` workers answered."""
    views: dict[int, dict[str, Any]] = {}

    async def all_answered() -> bool:  # a worker still starting is not listening yet
        data = await _stats(port)
        views[data["pid"]] = data
        return len(views) >= want

    await wait_for(all_answered, f"{want} workers answering", limit=30)
    return views


def _events_total(body: str, event: str) -> float:
    found = re.search(rf'rollout_events_total{{event="{re.escape(event)}"}} ([0-9.e+]+)', body)
    return float(found.group(1)) if found else 0.0


async def test_two_workers_share_the_port_metrics_and_drain_on_sigterm(
    pool: tuple[int, asyncio.subprocess.Process],
) -> None:
    """WORK-1: two processes answer on one port; WORK-3: any worker's /metrics counts every
    worker's responses; WORK-2: SIGTERM to the parent stops both, cleanly."""
    port, proc = pool
    base = f"http://127.0.0.1:{port}/v1"
    requests = 24
    for n in range(requests):  # a fresh connection each: the kernel spreads them
        async with AsyncOpenAI(base_url=base, api_key="x", max_retries=0) as client:
            done = await client.responses.create(model="sim", input=f"hello {n}", store=False)
            assert done.status == "completed"
    views = await _worker_views(port)
    pids = set(views)
    assert len(pids) == 2
    for _ in range(400):  # each worker's own counters, refreshed until they add up
        views.update(await _worker_views(port))
        served = [v["counters"].get("create.stateless", 0) for v in views.values()]
        if sum(served) == requests:
            break
    assert sum(served) == requests and min(served) > 0  # both served some
    body = ""

    async def both_counted() -> bool:  # WORK-3: one scrape covers both (counted post-inference)
        nonlocal body
        async with (
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http,
            http.get(f"http://127.0.0.1:{port}/metrics") as resp,
        ):
            body = await resp.text()
        return (
            f'rollout_responses_total{{mode="standard",status="completed"}} {requests}.0' in body
            and _events_total(body, "create.stateless") == requests
        )

    await wait_for(both_counted, "both workers' responses in one scrape", limit=20)
    assert f'rollout_responses_total{{mode="standard",status="completed"}} {requests}.0' in body
    assert _events_total(body, "create.stateless") == requests
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), 30) == 0
    for pid in pids:  # no worker outlives the parent
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


async def test_state_is_per_process_with_the_memory_store(
    pool: tuple[int, asyncio.subprocess.Process],
) -> None:
    """WORK-4: with the in-memory store each worker keeps its own state. A stored response is
    found by the worker that made it and not found by the other; a rollout parked by a closed
    socket (``store: false``) resumes only on its own worker: elsewhere its id is
    ``previous_response_not_found``, never served."""
    port, _ = pool
    base = f"http://127.0.0.1:{port}/v1"
    async with AsyncOpenAI(base_url=base, api_key="x", max_retries=0) as client:
        stored = await client.responses.create(model="sim", input="Keep this.")
        statuses = set()
        for _ in range(60):
            statuses.add(await _get_status(port, stored.id))
            if statuses == {200, 404}:
                break
        assert statuses == {200, 404}
        async with client.responses.connect() as conn:
            await conn.response.create(model="sim", input="Read it.", tools=TOOLS, store=False)
            first = (await _terminal(conn)).response
        call = first.output[-1]
        answer = [{"type": "function_call_output", "call_id": call.call_id, "output": "x"}]
        outcomes: list[str] = []
        for _ in range(60):  # fresh connections land on either worker
            async with client.responses.connect() as conn:
                await conn.response.create(
                    model="sim",
                    previous_response_id=first.id,
                    input=answer,
                    tools=TOOLS,
                    store=False,
                )
                event = await _terminal(conn)
            outcomes.append(event.error.code if event.type == "error" else event.type)
            if event.type == "response.completed":
                break
    assert outcomes[-1] == "response.completed"  # resumed on the worker that parked it
    assert set(outcomes[:-1]) <= {"previous_response_not_found"}


async def _get_status(port: int, response_id: str) -> int:
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http,
        http.get(f"http://127.0.0.1:{port}/v1/responses/{response_id}") as resp,
    ):
        return resp.status


@pytest.mark.parametrize("store_url", [pytest.param("sqlite", id="sqlite")], indirect=True)
async def test_chain_alternates_between_workers_on_a_shared_sqlite_store(
    pool: tuple[int, asyncio.subprocess.Process],
) -> None:
    """WORK-4: with a shared store any worker continues any ``store: true`` chain. Turns over
    fresh connections land on both workers; each continues from the last response wherever it
    was made (its own parked rollout, PARK-4, or hydration cache, HYD-1, or the shared file,
    COMPAT-4); a delete made on
    one worker is seen by the other's cache (HYD-5)."""
    port, _ = pool
    base = f"http://127.0.0.1:{port}/v1"
    turns = 16
    async with AsyncOpenAI(base_url=base, api_key="x", max_retries=0) as client:
        response = await client.responses.create(model="sim", input="Read it.", tools=TOOLS)
        for _ in range(turns):
            call = response.output[-1]
            assert call.type == "function_call"
            response = await _fresh_create(
                base,
                model="sim",
                previous_response_id=response.id,
                input=[
                    {"type": "function_call_output", "call_id": call.call_id, "output": "x"},
                    {"role": "user", "content": "Read it again."},
                ],
                tools=TOOLS,
            )
        views = await _worker_views(port)
        for _ in range(100):
            views.update(await _worker_views(port))
        continued = {
            pid: v["counters"].get("create.hydrated", 0)
            + v["counters"].get("create.unparked", 0)  # its own parked chain (PARK-4)
            + v["counters"].get("create.store_hydrate", 0)
            for pid, v in views.items()
        }
        assert sum(continued.values()) == turns and min(continued.values()) > 0
        assert sum(v["counters"].get("create.store_hydrate", 0) for v in views.values()) > 0
        await client.responses.delete(response.id)
        for _ in range(20):  # whichever worker answers, its cache must not serve it
            with pytest.raises(openai.BadRequestError) as info:
                await _fresh_create(
                    base, model="sim", previous_response_id=response.id, input="more"
                )
            assert info.value.code == "previous_response_not_found"


async def _fresh_create(base: str, **params: Any) -> Any:
    """A create on a new client (a new connection), so the kernel may pick either worker."""
    async with AsyncOpenAI(base_url=base, api_key="x", max_retries=0) as client:
        return await client.responses.create(**params)


async def _terminal(conn: Any) -> Any:
    async for event in conn:
        if event.type in ("response.completed", "error"):
            return event


def test_worker_argv_drops_only_the_workers_flag() -> None:
    argv = ["--port", "9000", "--workers", "4", "--tps", "5", "--workers=3", "--ledger", "x"]
    assert worker_argv(argv) == ["--port", "9000", "--tps", "5", "--ledger", "x"]


async def test_workers_follow_a_killed_parent(pool: tuple[int, asyncio.subprocess.Process]) -> None:
    """WORK-2: even a parent killed by SIGKILL takes its workers with it (they drain and exit)."""
    port, proc = pool
    pids = set(await _worker_views(port))
    proc.kill()
    await proc.wait()
    await wait_for(lambda: not any(_alive(pid) for pid in pids), "the workers to exit")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # An exited child of the killed parent may linger as a zombie until init reaps it.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:  # reaped meanwhile
        return False


async def test_per_worker_rate_limits_are_warned_at_start() -> None:
    """LIVE-6, RATE-7: rate limits on a store that counts per process (memory) with
    ``--workers 2`` multiply a key's limits: the parent says so on stderr before it serves."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cli", "serve", "--port", "0", "--announce-port",
        "--workers", "2", "--tps", "0", "--log-level", "WARNING", "--store", "memory://",
        "--rate-requests", "5",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        await stdout_port(proc, 60)
    finally:
        proc.kill()
        await proc.wait()
    assert proc.stderr is not None
    err = (await proc.stderr.read()).decode()
    assert "rate limits are counted per worker on the memory store" in err, err
    assert "up to 2 times its limits" in err, err
