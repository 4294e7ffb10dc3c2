"""The memory budget's split (MEM-12), one key's quarter (MEM-13) and the background logs'
shedding (MEM-14), on real servers with two API keys, driven over HTTP and the openai SDK.

The shares are read where they bound (the hydration cache, the parking lot, the background log
budget) as the figures SPEC states, written out here, not imported, so a changed share fails.
The per-key parts are then shown to hold: one key's parked rollouts and finished background
logs go, oldest first, once they pass a quarter of their share, and the other key's stay."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
from openai import AsyncOpenAI

from engine.core import EngineConfig
from engine.retained.parking import ParkingBounds
from engine.server.transport.keys import BACKGROUND
from engine.server.transport.server_config import ServerConfig
from tests.support.server import LiveServer
from tests.support.wait import wait_for

KEYS = ServerConfig(api_keys=frozenset({"key-alice", "key-bob"}))
TOOLS: list[Any] = [
    {"type": "function", "name": name, "parameters": {"type": "object", "properties": {}}}
    for name in ("list_dir", "read_file", "search", "edit_file", "run_tests")
]
MODEL = "sim-coding-agent"
MIB = 1024 * 1024


async def _server(server_factory: Callable[..., Any], **config: Any) -> LiveServer:
    live: LiveServer = await server_factory(
        EngineConfig(tokens_per_second=0, **config), server=KEYS
    )
    return live


async def test_the_budget_splits_half_thirty_twenty(server_factory: Callable[..., Any]) -> None:
    """MEM-12, MEM-13: 100 MiB is 50 MiB of hydration cache, 30 MiB of parking and 20 MiB of
    background logs, a quarter of each of the last two per key; a bound set on its own
    replaces its share and leaves the others."""
    live = await _server(server_factory, memory_budget=100 * MIB)
    engine, runs = live.engine, live.runner.app[BACKGROUND]
    assert engine.hydrated.max_bytes == 50 * MIB
    bounds = engine.parking.bounds
    assert (bounds.nbytes, bounds.nbytes_per_owner) == (30 * MIB, 30 * MIB // 4)
    assert (runs.budget.total, runs.budget.per_owner) == (20 * MIB, 20 * MIB // 4)
    own = ParkingBounds(nbytes=5 * MIB, nbytes_per_owner=MIB)
    live = await _server(
        server_factory, memory_budget=100 * MIB, hydration_cache_bytes=MIB, park_bounds=own
    )
    assert live.engine.hydrated.max_bytes == MIB and live.engine.parking.bounds == own
    assert live.runner.app[BACKGROUND].budget.total == 20 * MIB


# ----------------------------------------------------------------------------- parking


async def _park(client: AsyncOpenAI) -> Any:
    """One connection: a create that ends suspended on a tool call; the socket closes."""
    async with client.responses.connect() as conn:
        await conn.response.create(model=MODEL, input="Fix the tests.", tools=TOOLS, store=False)
        async for event in conn:
            if event.type in ("response.completed", "error"):
                break
    assert event.type == "response.completed", event
    return event.response


async def _resume(client: AsyncOpenAI, response: Any) -> str:
    """Continue a parked rollout on a new connection: ``completed`` or the error's code."""
    call = response.output[-1]
    output = [{"type": "function_call_output", "call_id": call.call_id, "output": "ok"}]
    async with client.responses.connect() as conn:
        await conn.response.create(
            model=MODEL, previous_response_id=response.id, input=output, tools=TOOLS, store=False
        )
        async for event in conn:
            if event.type == "response.completed":
                return "completed"
            if event.type == "error":
                return str(event.error.code)
    raise AssertionError("no terminal event")


async def test_one_key_parks_a_quarter_of_the_parking_share(
    server_factory: Callable[..., Any],
) -> None:
    """MEM-13 (PARK-7): a budget whose parking share holds about ten rollouts, so a key's
    quarter holds two: alice parks six, and only her newest stay (her oldest go first), within
    her quarter; bob's one, parked before them all, is untouched and resumes."""
    probe = await _server(server_factory)
    sdk = AsyncOpenAI(base_url=probe.base_url, api_key="key-bob", max_retries=0)
    try:
        await _park(sdk)
        await wait_for(lambda: probe.engine.counters["park.parked"] == 1)
        one = probe.engine.parking.nbytes  # what one such rollout is charged
    finally:
        await sdk.close()
    budget = one * 100 // 3  # parking share 0.3 x budget = 10 rollouts; a quarter is 2.5
    quarter = budget * 3 // 10 // 4
    live = await _server(server_factory, memory_budget=budget)
    alice = AsyncOpenAI(base_url=live.base_url, api_key="key-alice", max_retries=0)
    bob = AsyncOpenAI(base_url=live.base_url, api_key="key-bob", max_retries=0)
    lot, counters = live.engine.parking, live.engine.counters
    try:
        bobs = await _park(bob)
        await wait_for(lambda: counters["park.parked"] == 1)
        hers = []
        for n in range(6):
            hers.append(await _park(alice))
            await wait_for(lambda n=n: counters["park.parked"] == n + 2)  # type: ignore[misc]
            assert lot.nbytes - one <= quarter, (n, lot.nbytes, one, quarter)
        assert counters["park.evicted"] == 4 and len(lot) == 3
        assert await _resume(alice, hers[0]) == "previous_response_not_found"
        assert await _resume(alice, hers[-1]) == "completed"
        assert await _resume(bob, bobs) == "completed"
    finally:
        await alice.close()
        await bob.close()


# ----------------------------------------------------------------------------- background


async def _background(http: aiohttp.ClientSession, url: str, key: str) -> str:
    """A background create, waited for until it is finished: its id."""
    headers = {"Authorization": f"Bearer {key}"}
    body = {"model": "sim", "input": "Tell me about logs.", "background": True, "store": True}
    async with http.post(f"{url}/responses", json=body, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        response_id: str = (await resp.json())["id"]
    for _ in range(2000):
        async with http.get(f"{url}/responses/{response_id}", headers=headers) as resp:
            if (await resp.json())["status"] not in ("queued", "in_progress"):
                return response_id
        await asyncio.sleep(0.01)
    raise AssertionError(f"{response_id} never finished")


async def _replayable(http: aiohttp.ClientSession, url: str, key: str, response_id: str) -> bool:
    """Whether its event log can still be replayed from the start (BG-5)."""
    headers = {"Authorization": f"Bearer {key}"}
    query = f"{url}/responses/{response_id}?stream=true&starting_after=-1"
    async with http.get(query, headers=headers) as resp:
        await resp.read()
        return resp.status == 200


async def test_one_keys_finished_logs_go_first_past_its_quarter(
    server_factory: Callable[..., Any],
) -> None:
    """MEM-13, MEM-14: a budget whose background share holds about ten finished event logs, so
    a key's quarter holds two: bob's one log stays replayable while alice's six pass her
    quarter and her own oldest are forgotten, her newest kept, her bytes within the quarter."""
    probe = await _server(server_factory)
    async with aiohttp.ClientSession() as http:
        await _background(http, probe.base_url, "key-bob")
        probe_runs = probe.runner.app[BACKGROUND]
        await wait_for(lambda: len(probe_runs.finished) == 1)
        one = probe_runs.budget.nbytes  # what one such log is charged
        budget = one * 50  # background share 0.2 x budget = 10 logs; a quarter is 2.5
        quarter = budget * 2 // 10 // 4
        live = await _server(server_factory, memory_budget=budget)
        url, runs = live.base_url, live.runner.app[BACKGROUND]
        bobs = await _background(http, url, "key-bob")
        hers = [await _background(http, url, "key-alice") for _ in range(6)]
        await wait_for(lambda: not runs.live)
        assert runs.budget.nbytes - one <= quarter, (runs.budget.nbytes, one, quarter)
        assert not await _replayable(http, url, "key-alice", hers[0])
        assert await _replayable(http, url, "key-alice", hers[-1])
        assert await _replayable(http, url, "key-bob", bobs)
        assert len(runs.finished) == 3, list(runs.finished)
