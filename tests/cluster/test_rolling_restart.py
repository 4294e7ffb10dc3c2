"""Rolling restart under load (DRAIN-5, LOAD-2), small scale: while resuming agents run through
HAProxy, each node in turn is sent SIGTERM, drains, exits and starts again. Nothing any client
saw acknowledged is lost, and what the clients saw go wrong is only the documented drain
signals. The full-scale command and its p99 figures are in docs/benchmark.md."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from cli.launcher import Cluster
from clients.bench.suites.load import LoadSettings, drive
from clients.bench.suites.load_checks import LoadCounts
from clients.bench.suites.resume import verify_acknowledged
from tests.cluster.conftest import cluster_spec

DOCUMENTED = {"ws_close_1001", "server_shutting_down", "upgrade_502", "upgrade_503"}


@pytest.mark.timeout(300)
async def test_rolling_restart_loses_nothing(tmp_path: Path) -> None:
    # The model paced at 1,000 tokens/s (the last --tps wins): a wave's sockets must outlive a
    # node's drain delay (1.5 s, tests/cluster/conftest.py) for the restarts to meet live
    # sockets, on a quiet machine as on a loaded one. At --tps 0 a wave took as long as the CPU
    # made it: under load long enough, on a quiet machine under the delay (reconnects = 0).
    cluster = Cluster(cluster_spec(tmp_path, "haproxy", "--bench-models", "--tps", "1000"))
    await cluster.start()
    settings = LoadSettings(connections=8, turns=150, http_clients=2, resume=True)
    total, waves = LoadCounts(), 0
    try:
        restart = asyncio.create_task(cluster.rolling_restart())
        # Waves of the bounded load back to back until every node has restarted, then one
        # more: agents are connected throughout, on both nodes (they send no API key, so
        # HAProxy balances them round robin, PARK-8).
        while not restart.done() or waves == 0:
            total.merge(await drive(settings, cluster.url, range(settings.connections), 2))
            waves += 1
        await restart
        total.merge(await drive(settings, cluster.url, range(settings.connections), 2))
        async with aiohttp.ClientSession() as http:
            found = await verify_acknowledged(http, cluster.url, total.acknowledged)
    finally:
        await cluster.stop()
    assert total.lost == total.misordered == 0, total.errors
    assert total.errors == []  # an error event other than the drain's, or a dead rollout
    assert total.http_failures == 0, total.http_failure_kinds  # HAProxy retried refused ones
    assert total.acknowledged and found == {"retrieved": len(total.acknowledged)}
    assert total.turns == (waves + 1) * settings.connections * (settings.turns + 1)
    assert set(total.drain_signals) <= DOCUMENTED, total.drain_signals
    assert total.reconnects >= 1  # the restarts did hit live sockets, which came back
