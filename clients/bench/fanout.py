"""``rollout bench --load --client-processes K`` (LOAD-3): the load client split over K OS
processes, so that on a small machine one client's event loop is not the ceiling of what the
servers are measured to serve.

Process ``i`` of K runs the agents ``i, i+K, i+2K, …`` (so standard and append mode stay mixed)
and its share of the HTTP clients, each on its own event loop; the parent waits and merges
their counts (sums, and the per-turn overhead samples, so percentiles are of the whole run).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

from clients.bench.load import LoadCounts, LoadSettings, drive

START_DELAY_S = 3.0  # time for K interpreters to start and import, so the shares start together


def _share(settings: LoadSettings, url: str, index: int, start_at: float) -> LoadCounts:
    """In a child process: this share of the load, on a fresh event loop, from ``start_at``
    (``time.monotonic``, the same clock in every process) on."""
    time.sleep(max(0.0, start_at - time.monotonic()))
    k = settings.client_processes
    http_clients = settings.http_clients // k + (1 if index < settings.http_clients % k else 0)
    agents = range(index, settings.connections, k)
    return asyncio.run(drive(replace(settings, client_processes=1), url, agents, http_clients))


async def drive_in_processes(settings: LoadSettings, url: str) -> LoadCounts:
    """Run K shares at once (``spawn``: no inherited event loop or sockets) and merge them."""
    k = settings.client_processes
    loop, start_at = asyncio.get_running_loop(), time.monotonic() + START_DELAY_S
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=k, mp_context=context) as pool:
        shares = await asyncio.gather(
            *(loop.run_in_executor(pool, _share, settings, url, i, start_at) for i in range(k))
        )
    merged = LoadCounts()
    for counts in shares:
        merged.merge(counts)
    return merged
