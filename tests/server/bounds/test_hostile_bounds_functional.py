"""A hostile client pushes every per-process buffer past its bound (LIM-21..LIM-23, HYD-2,
PARK-7), and the server's memory stays bounded.

The server runs in this process on an ephemeral loopback port, with bounds small enough to
push in seconds (16 MiB each). Images carry the bytes: a 1 MiB data URL renders as a handful
of tokens, which is exactly what a token-denominated bound would miss. The client sends about
ten times what the bounds allow; each structure must stay within its bound, and the process's
resident memory may grow by at most ``RSS_GROWTH_LIMIT`` (the two bounded caches plus the
allocator's slack), well under what keeping the pushed data would take.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI

from engine.core import EngineConfig
from engine.models.router import simulator_router
from engine.models.sim.simulator import SimulatedModel
from engine.retained.parking import ParkingBounds
from engine.server.transport.server_config import ServerConfig
from engine.store import open_store
from tests.support.server import LiveServer, start_server
from tests.support.tools import WEATHER
from tests.support.wait import wait_for

MIB = 1024 * 1024
BOUND = 16 * MIB
IMAGE = "data:image/png;base64," + "A" * MIB
PUSHED_RESPONSES = 80  # stored responses, 1 MiB each: 5x the hydration bound
PUSHED_PARKS = 48  # parked rollouts, 1 MiB each: 3x the parking bound
SLOW = "sim-slow"
RSS_GROWTH_LIMIT = 96 * MIB  # the pushes carry ~160 MiB; the bounds allow 32 MiB retained


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def _image_message(text: str) -> list[Any]:
    content = [
        {"type": "input_text", "text": text},
        {"type": "input_image", "image_url": IMAGE, "detail": "low"},
    ]
    return [{"role": "user", "content": content}]


@pytest.fixture
async def live(tmp_path: Path) -> AsyncIterator[LiveServer]:
    config = EngineConfig(
        tokens_per_second=2000,  # a create takes a few ms: the flood finds its lane busy
        hydration_cache_bytes=BOUND,
        park_bounds=ParkingBounds(nbytes=BOUND, nbytes_per_owner=BOUND),
        max_queued_bytes=4 * MIB,
    )
    store = open_store(f"sqlite:///{tmp_path / 'hostile.db'}")
    router = simulator_router(2000)
    # The flood's model answers at 5 tokens/s: its first create still runs while the other
    # eleven arrive, on a loaded machine as on an idle one (the queue's bound is what is tested).
    router.routes[SLOW] = SimulatedModel(5)
    server = await start_server(
        config, router=router, store=store, server=ServerConfig(max_inspector_viewers=4)
    )
    try:
        yield server
    finally:
        await server.runner.cleanup()


async def _park_one(client: AsyncOpenAI, n: int) -> None:
    """A connection that leaves a 1 MiB rollout suspended on a tool call, then closes."""
    async with client.responses.connect() as conn:
        await conn.response.create(
            model="gpt-x", input=_image_message(f"Weather {n}?"), tools=[WEATHER], store=False
        )
        async for event in conn:
            if event.type in ("response.completed", "error"):
                assert event.type == "response.completed"
                return


async def _flood_queue(live: LiveServer) -> list[str]:
    """One connection, 12 creates of 1 MiB on one lane at once: the queued bytes are capped."""
    codes: list[str] = []
    async with aiohttp.ClientSession() as http, http.ws_connect(live.ws_url) as ws:
        body = {"type": "response.create", "model": SLOW, "store": False, "max_output_tokens": 8}
        for n in range(12):
            await ws.send_json({**body, "input": _image_message(f"flood {n}")})
        answered = 0
        while answered < 12:
            event = await ws.receive_json(timeout=30)
            if event["type"] == "error":
                codes.append(event["error"]["code"])
                answered += 1
            elif event["type"] in ("response.completed", "response.incomplete"):
                answered += 1
    return codes


async def _crowd_inspector(live: LiveServer) -> int:
    """Ten viewers try to open the feed: only the bound's worth get in."""
    url = f"ws://127.0.0.1:{live.port}/inspect/feed"
    opened = []
    async with aiohttp.ClientSession() as http:
        for _ in range(10):
            try:
                opened.append(await http.ws_connect(url))
            except aiohttp.WSServerHandshakeError as refused:
                assert refused.status == 503
        for ws in opened:
            await ws.close()
    return len(opened)


@pytest.mark.timeout(240)  # ~160 MiB pushed through the server: slow on a loaded 2-core machine
async def test_memory_stays_bounded_under_a_hostile_client(live: LiveServer) -> None:
    client = AsyncOpenAI(base_url=live.base_url, api_key="x", max_retries=0)
    await client.responses.create(model="sim", input=_image_message("warm up"))
    baseline = _rss()
    try:
        for n in range(PUSHED_RESPONSES):
            await client.responses.create(model="sim", input=_image_message(f"image {n}"))
        for n in range(PUSHED_PARKS):
            await _park_one(client, n)
        codes = await _flood_queue(live)
        viewers = await _crowd_inspector(live)
    finally:
        await client.close()
    counters = live.engine.counters  # the last close is parked a moment after the client left
    await wait_for(lambda: counters["park.parked"] + counters["park.refused"] >= PUSHED_PARKS)
    engine = live.engine
    assert 0 < engine.hydrated.nbytes <= BOUND
    assert engine.counters["hydration.evicted"] > 0
    assert 0 < engine.parking.nbytes <= BOUND
    assert engine.counters["park.evicted"] > 0
    assert "websocket_queue_full" in codes
    assert viewers == 4
    growth = _rss() - baseline
    assert growth < RSS_GROWTH_LIMIT, f"RSS grew by {growth / MIB:.0f} MiB"
