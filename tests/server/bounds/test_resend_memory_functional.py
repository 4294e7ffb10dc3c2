"""MEM-10, MEM-12, HYD-2, COMPAT-7, COMPAT-9: what the hydration cache charges a resend's
entries (its published context, its place in the resend index, the create's remembered raw
input, ``Sent``) is memory it really holds, so its share of ``--memory-budget`` bounds the
process's resident size under a stateless-resend workload too.

A real ``rollout serve`` process (SQLite store, so records live on disk; ``--park-seconds 0``,
so the cache is the only part that holds anything) with one API key per client, each its own
owner (so the index is per owner, COMPAT-9): every client runs a coding agent's loop without
``previous_response_id``, sending its whole history back each turn as it received it (ids and
status kept, the SDK's shapes), half with ``store: false``, half ``store: true``. Each turn's
response is published with its owner and digest, and remembers its create's raw input, the
next turn is a resend of it (``create.resent``, ``resend.raw_held``). While the cache fills,
RSS grows by no more than the hydration-cache RSS test's factor of what the cache counts;
driven past its share, the count stays within it, it evicts, and RSS stays near the share."""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import aiohttp

from tests.server.bounds.budget_node import MIB, budget_node, operator_stats, rss

BUDGET = 24 * MIB
SHARE = BUDGET // 2  # the hydration cache's half (MEM-12)
TURNS = 6  # creates per client: the first, then five resends of its growing history
AT_ONCE = 16
WARM = 32
CLIENTS = 1_200
KEYS = [f"key-{n:05d}" for n in range(CLIENTS)]
OPERATOR = "key-operator"
TOOLS: list[Any] = [
    {"type": "function", "name": name, "parameters": {"type": "object", "properties": {}}}
    for name in ("list_dir", "read_file", "search", "edit_file", "run_tests")
]


def _node(tmp_path: Path) -> AbstractAsyncContextManager[tuple[int, int]]:
    return budget_node(tmp_path, BUDGET, "--park-seconds", "0", keys=KEYS, operator=OPERATOR)


async def _client(http: aiohttp.ClientSession, port: int, n: int) -> None:
    """One agent's loop, stateless: its whole history every turn, the output as received, then
    the tool's answer (a file of ~500 bytes) or the next task."""
    headers = {"Authorization": f"Bearer {KEYS[n]}"}
    history: list[dict[str, Any]] = [{"role": "user", "content": f"task {n}: fix test {n}"}]
    for turn in range(TURNS):
        body = {"model": "sim-coding-agent", "input": history, "tools": TOOLS,
                "store": n % 2 == 1}  # fmt: skip
        url = f"http://127.0.0.1:{port}/v1/responses"
        async with http.post(url, json=body, headers=headers) as resp:
            assert resp.status == 200, await resp.text()
            output = (await resp.json())["output"]
        history += output
        last = output[-1]
        if last["type"] == "function_call":
            code = f"def f{turn}(x):\n    return x + {n} * {turn}\n" * 12
            history.append({"type": "function_call_output", "call_id": last["call_id"],
                            "output": code})  # fmt: skip
        else:
            history.append({"role": "user", "content": f"next {turn}: {'more ' * 40}"})


async def _drive(http: aiohttp.ClientSession, port: int, clients: range) -> None:
    for start in range(clients.start, clients.stop, AT_ONCE):
        batch = range(start, min(start + AT_ONCE, clients.stop))
        await asyncio.gather(*(_client(http, port, n) for n in batch))


async def test_resent_histories_keep_rss_within_the_share(tmp_path: Path) -> None:
    """MEM-10, MEM-12, HYD-2, COMPAT-9: the resend workload fills the cache with published
    contexts and remembered inputs; RSS grows by no more than the cache's own factor of what
    it counts, and past the share the count stays within it and RSS near it."""
    async with _node(tmp_path) as (port, pid), aiohttp.ClientSession() as http:
        await _drive(http, port, range(WARM))  # allocator arenas, codecs, SQLite pages
        warm = await operator_stats(http, port, OPERATOR)
        counted0, rss0 = warm["hydration_cache"]["bytes"], rss(pid)
        per_client = counted0 // WARM
        filling = int(0.9 * SHARE // per_client) - WARM
        await _drive(http, port, range(WARM, WARM + filling))
        filled = await operator_stats(http, port, OPERATOR)
        rss1 = rss(pid)
        counters = filled["counters"]
        assert counters.get("hydration.evicted", 0) == 0
        assert counters["create.resent"] == (WARM + filling) * (TURNS - 1)
        assert counters["resend.raw_held"] > 0
        grown, counted = rss1 - rss0, filled["hydration_cache"]["bytes"] - counted0
        # The hydration-cache RSS test's factor (1.75; it measures 1.37x-1.45x for stored
        # creates of whole histories). Here measured 0.92x-1.01x (2026-12-06): a resend's
        # entry shares its items with the entries before it in its chain (a fork), and each
        # is charged them whole, as it must be once those are evicted; so no low bound here:
        # tests/engine/test_resend_footprint.py checks one entry's charge from both sides.
        # Before the index and Sent charges were raised: 1.07x.
        ratio = grown / counted
        assert ratio < 1.75, f"RSS +{grown / MIB:.1f} MiB for {counted / MIB:.1f} counted"
        await _drive(http, port, range(WARM + filling, min(CLIENTS, WARM + 3 * filling)))
        past = await operator_stats(http, port, OPERATOR)
        rss2 = rss(pid)
    assert past["counters"]["hydration.evicted"] > 0
    assert past["hydration_cache"]["bytes"] <= SHARE
    assert past["budget_held"]["hydration"] <= SHARE
    # ~2x the share pushed through: measured 11.1-11.2 MiB for the 12 MiB share (the hydration
    # test's bound; it measures 18.5-19.1 MiB)
    assert rss2 - rss0 < 1.6 * SHARE + 4 * MIB, f"RSS +{(rss2 - rss0) / MIB:.1f} MiB"
