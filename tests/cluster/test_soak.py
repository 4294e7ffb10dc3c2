"""The soak, short (LIVE-9): ``rollout bench --soak``'s own code for a few seconds through
``rollout cluster``: every scenario (WS and HTTP chains, SSE, background runs cancelled and
followed from fresh connections, parked rollouts continued from fresh connections) runs, with
0 client-visible errors, nothing acknowledged lost and every background response terminal; the
report keeps each node's RSS series beside what its memory budget held."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clients.bench.suites.soak import SoakSettings, run_soak


@pytest.mark.timeout(300)
async def test_a_short_soak_has_no_client_visible_error(tmp_path: Path) -> None:
    settings = SoakSettings(seconds=12, client_processes=1, agents_per_process=3)
    report = await run_soak(settings, tmp_path / "cluster")
    print(json.dumps(report, indent=1))  # the figures, for a failure's log
    assert report["client_errors"] == 0, report["error_kinds"]
    assert set(report["by_scenario"]) == {
        "ws_chain", "http_chain", "sse", "bg_cancel", "bg_follow", "parked"
    }, report  # fmt: skip
    assert (report["acknowledged_lost"], report["unreadable"]) == (0, 0), report
    assert report["background_unfinished"] == 0, report
    # LIVE-9: the RSS series is kept, each sample beside what the node's budget held (MEM-12)
    for node in ("node0", "node1"):
        series = report["rss"][node]["series"]
        assert len(series) >= 2 and all(rss > 0 for _, rss, _ in series), series
        assert any(held > 0 for *_, held in series), series
