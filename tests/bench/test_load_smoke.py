"""LOAD-1, short: concurrent WebSocket agents (both modes) plus HTTP traffic against a real
server process; every event checked. Behaviour only: no timing assertions."""

from __future__ import annotations

from clients.bench.load import LoadSettings, main_load


async def test_short_load_loses_and_misorders_nothing() -> None:
    report = await main_load(LoadSettings(connections=12, turns=4, http_clients=2))
    assert report["lost"] == 0 and report["misordered"] == 0 and report["errors"] == []
    assert report["turns"] == report["turns_expected"] == 12 * 5
    assert report["responses"] == 6 * 5 + 6  # standard: one per turn; append: one per rollout
    assert report["http_requests"] > 0 and report["http_failures"] == 0
