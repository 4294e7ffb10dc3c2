"""MEM-11, MEM-12, PARK-7, PARK-4: what the memory budget counts for a parked HTTP chain is the
memory it holds, and many concurrent chains keep a process's resident size within what the
budget bounds.

A real ``rollout serve`` process (SQLite store, so the records live on disk, not in its heap)
with one API key per chain, so no key's quarter (MEM-13) is what bounds them: 300 chains of
three creates each run at once over HTTP, each ending on a tool call, so each leaves its
rollout parked (PARK-4). The server's RSS (``/proc/<pid>/status``) must grow by about what
``/debug/stats`` says the parts of the budget hold (``budget_held``); driven past the shares,
what they hold stays within them and RSS stays near them."""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import aiohttp

from tests.server.bounds.budget_node import MIB, budget_node, operator_stats, rss

BUDGET = 48 * MIB
PARKING = BUDGET * 3 // 10  # the parking lot's 30% (MEM-12)
CHAINS = 300  # at once, one key each
WARM = 40
KEYS = [f"key-{n:05d}" for n in range(WARM + 9 * CHAINS)]
OPERATOR = "key-operator"
TOOLS: list[Any] = [
    {"type": "function", "name": name, "parameters": {"type": "object", "properties": {}}}
    for name in ("list_dir", "read_file", "search", "edit_file", "run_tests")
]


def _node(tmp_path: Path, *extra: str) -> AbstractAsyncContextManager[tuple[int, int]]:
    return budget_node(tmp_path, BUDGET, *extra, keys=KEYS, operator=OPERATOR)


async def _chain(http: aiohttp.ClientSession, port: int, key: str) -> None:
    """Three creates by ``previous_response_id``, each answering the last tool call: the
    second and third resume the rollout the one before parked (PARK-3), the third's stays."""
    headers = {"Authorization": f"Bearer {key}"}
    previous: dict[str, Any] | None = None
    answer: Any = "Fix the tests."
    for turn in range(3):
        body: dict[str, Any] = {"model": "sim-coding-agent", "input": answer, "tools": TOOLS}
        if previous is not None:
            body["previous_response_id"] = previous["id"]
        url = f"http://127.0.0.1:{port}/v1/responses"
        async with http.post(url, json=body, headers=headers) as resp:
            assert resp.status == 200, await resp.text()
            previous = await resp.json()
        call = previous["output"][-1]
        assert call["type"] == "function_call"
        output = f"{'x' * 200} {turn}"
        answer = [{"type": "function_call_output", "call_id": call["call_id"], "output": output}]


async def _drive(http: aiohttp.ClientSession, port: int, keys: list[str], at_once: int) -> None:
    for start in range(0, len(keys), at_once):
        batch = keys[start : start + at_once]
        await asyncio.gather(*(_chain(http, port, key) for key in batch))


async def test_a_parked_chain_costs_what_the_lot_counts(tmp_path: Path) -> None:
    """MEM-11, PARK-4, PARK-7: the hydration cache off, so the parking lot is the only part
    that holds anything. 300 chains at once leave 300 rollouts parked and RSS grows by about
    what the lot charges them (their contexts plus 32 KiB each); 900 more chains push the lot
    past its share: it evicts its oldest, holds no more than its share, and RSS stays near it."""
    hydration_off = _node(tmp_path, "--hydration-cache-bytes", "0")
    async with hydration_off as (port, pid), aiohttp.ClientSession() as http:
        await _drive(http, port, KEYS[:WARM], WARM)  # allocator arenas, codecs, SQLite
        before = await operator_stats(http, port, OPERATOR)
        rss0 = rss(pid)
        await _drive(http, port, KEYS[WARM : WARM + CHAINS], CHAINS)
        filled = await operator_stats(http, port, OPERATOR)
        rss1 = rss(pid)
        assert filled["parked"] == WARM + CHAINS
        assert filled["counters"].get("park.evicted", 0) == 0
        assert filled["budget_held"]["hydration"] == 0
        counted = filled["budget_held"]["parking"] - before["budget_held"]["parking"]
        # Measured 1.14-1.16 (8 chains at a time) and 1.34 (all 300 at once: what serving
        # them at once leaves behind) here, 0.87 on a CI machine (pages the warm-up freed,
        # reused); counted without the 32 KiB a rollout, about 8x; counted twice, about 0.6
        # here (0.45 where the count is 0.87).
        ratio = (rss1 - rss0) / counted
        assert 0.7 < ratio < 1.6, f"RSS +{(rss1 - rss0) / MIB:.1f} MiB, {counted / MIB:.1f}"
        await _drive(http, port, KEYS[WARM + CHAINS : WARM + 4 * CHAINS], CHAINS)  # past it
        past = await operator_stats(http, port, OPERATOR)
        rss2 = rss(pid)
    assert past["counters"]["park.evicted"] > 0
    assert past["budget_held"]["parking"] <= PARKING
    # measured 16.8-21.2 MiB for the 14.4 MiB share; a lot that kept what it evicts holds
    # ~40 MiB of parked rollouts here
    assert rss2 - rss0 < 1.6 * PARKING + 4 * MIB, f"RSS +{(rss2 - rss0) / MIB:.1f} MiB"


async def test_concurrent_chains_keep_rss_near_the_budget(tmp_path: Path) -> None:
    """MEM-12, PARK-4, HYD-3: the budget's default split. Each chain leaves its rollout parked
    and its responses' contexts in the hydration cache (the one its rollout moved on from, a
    copy); 2,700 chains, 300 at once, fill both shares past their bound. What they hold stays
    within the budget, and RSS grows by about what they hold, not by the chains driven."""
    async with _node(tmp_path) as (port, pid), aiohttp.ClientSession() as http:
        await _drive(http, port, KEYS[:WARM], WARM)
        rss0 = rss(pid)
        await _drive(http, port, KEYS[WARM:], CHAINS)
        past = await operator_stats(http, port, OPERATOR)
        rss1 = rss(pid)
    held = past["budget_held"]
    counters = past["counters"]
    assert counters["park.evicted"] > 0 and counters["hydration.evicted"] > 0
    assert held["parking"] <= PARKING and held["hydration"] <= BUDGET // 2
    # measured 53.1-58.5 MiB for the 38.4 MiB held (the background share is unused): 1.4-1.5x,
    # the hydration cache's own factor (test_memory_budget_functional.py); a lot that kept
    # what it evicts: 113 MiB
    assert rss1 - rss0 < 1.4 * BUDGET, f"RSS +{(rss1 - rss0) / MIB:.1f} MiB for {held}"
