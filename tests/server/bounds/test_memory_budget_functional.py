"""MEM-10..MEM-12: the hydration cache's count is real memory, so its share of
``--memory-budget`` bounds the process's resident size, not just a number it keeps.

A real ``rollout serve`` process (SQLite store, so the records live on disk, not in its heap)
gets stored responses of many small items, the shape where per-object overhead dominates (a
coding agent's tool calls and outputs). While the cache fills, the server's RSS (from
``/proc/<pid>/status``) must grow by about what the cache says it holds; driven to twice its
share, RSS must stay near the share. Counted the old way (the encoded JSON), the growth was
about twice the count (issue 24: 336 MB of RSS for 132 MB counted)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.server.bounds.budget_node import MIB, budget_node, operator_stats, rss

BUDGET = 24 * MIB
SHARE = BUDGET // 2  # the hydration cache's half (MEM-12)
CLIENTS = 4


def _items(n: int) -> list[dict[str, Any]]:
    """One agent's history: a task, then 15 tool calls and their outputs (31 items, ~25 KB)."""
    items: list[dict[str, Any]] = [{"role": "user", "content": f"task {n}: fix test {n}"}]
    for k in range(15):
        call = f"call_{n}_{k}"
        items.append(
            {"type": "function_call", "call_id": call, "name": "read_file",
             "arguments": f'{{"path": "src/mod{n}/file{k}.py"}}'}
        )  # fmt: skip
        output = f"def f(x):\n    return x + {k}\n" * 6
        items.append({"type": "function_call_output", "call_id": call, "output": output})
    return items


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[tuple[int, int]]:
    async with budget_node(tmp_path, BUDGET, "--park-seconds", "0") as (port, pid):
        yield port, pid


async def _drive(http: aiohttp.ClientSession, port: int, numbers: range) -> None:
    async def one_client(start: int) -> None:
        for n in numbers[start::CLIENTS]:
            body = {"model": "sim", "input": _items(n), "store": True}
            async with http.post(f"http://127.0.0.1:{port}/v1/responses", json=body) as r:
                assert r.status == 200

    await asyncio.gather(*(one_client(i) for i in range(CLIENTS)))


async def _cache(http: aiohttp.ClientSession, port: int) -> tuple[int, int]:
    stats = await operator_stats(http, port)
    return stats["hydration_cache"]["bytes"], stats["counters"].get("hydration.evicted", 0)


async def test_the_hydration_share_bounds_rss(node: tuple[int, int]) -> None:
    port, pid = node
    async with aiohttp.ClientSession() as http:
        await _drive(http, port, range(40))  # warm: allocator arenas, codecs, SQLite pages
        counted0, _ = await _cache(http, port)
        rss0 = rss(pid)
        per_entry = counted0 // 40
        filling = int(0.9 * SHARE // per_entry) - 40
        await _drive(http, port, range(40, 40 + filling))
        counted1, evicted1 = await _cache(http, port)
        rss1 = rss(pid)
        assert evicted1 == 0 and counted1 > SHARE // 2
        grown, counted = rss1 - rss0, counted1 - counted0
        # the count is the memory (MEM-10), from both sides: RSS grows by about what the cache
        # says it added, plus what serving 1,000 requests leaves elsewhere (allocator arenas,
        # SQLite pages, counters). Measured 1.37x-1.45x (2026-12-02) with a charge within 3% of
        # tracemalloc; items charged twice show 0.93x, so the low bound catches an overcharge.
        # The encoded-size count shows 1.67x, too near this noise (the bound was 1.5 and a run
        # hit 1.501): tests/engine/test_footprint.py catches that one exactly (tools/mutants.toml)
        ratio = grown / counted
        assert 1.05 < ratio < 1.75, f"RSS +{grown / MIB:.1f} MiB for {counted / MIB:.1f} counted"
        await _drive(http, port, range(40 + filling, 40 + 3 * filling))  # past the share
        counted2, evicted2 = await _cache(http, port)
        rss2 = rss(pid)
    assert evicted2 > 0 and counted2 <= SHARE
    # ~2x the share was pushed through; resident growth stays near the share: measured
    # 18.5-19.1 MiB for the 12 MiB share (22.2 with the encoded-size count); a cache that kept
    # what it evicts would hold ~2.7 shares
    assert rss2 - rss0 < 1.6 * SHARE + 4 * MIB, f"RSS +{(rss2 - rss0) / MIB:.1f} MiB"
