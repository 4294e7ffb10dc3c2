"""Chaos, short (CHAOS-1..CHAOS-3): ``rollout bench --chaos``'s own code on a short schedule.
``rollout cluster`` with API keys (two nodes, HAProxy, redis-server with its append-only file)
under load from two client processes; one node killed -9 and restarted by the launcher, then
the Redis stopped and restarted by it. Every acknowledged ``store: true`` response is read back
afterwards: none lost. Per fault, the child came back and the clients were served again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clients.bench.suites.chaos import ChaosSettings, run_chaos


@pytest.mark.timeout(240)
async def test_kill_a_node_and_restart_redis_under_load_loses_nothing(tmp_path: Path) -> None:
    settings = ChaosSettings(
        seconds=16, interval=6, node_kills=1, client_processes=2, agents_per_process=2
    )
    report = await run_chaos(settings, tmp_path / "cluster")
    print(json.dumps(report, indent=1))  # the figures, for a failure's log
    faults = {row["fault"]: row for row in report["faults"]}
    assert set(faults) == {"kill -9 node0", "restart redis"}, report
    assert report["acknowledged"] > 0, report
    assert (report["acknowledged_lost"], report["unreadable"]) == (0, 0), report
    for row in faults.values():
        assert row["child_back_after_s"] is not None, report  # the launcher restarted it
        assert row["first_ack_after_s"] is not None, report  # and the clients were served
