"""LOAD-1, short: concurrent WebSocket agents (both modes) plus HTTP traffic against a real
server process; every event checked. Behaviour only: no timing assertions."""

from __future__ import annotations

from clients.bench.suites.load import LoadSettings, main_load


async def test_short_load_loses_and_misorders_nothing() -> None:
    report = await main_load(LoadSettings(connections=12, turns=4, http_clients=2))
    assert report["lost"] == 0 and report["misordered"] == 0 and report["errors"] == []
    assert report["turns"] == report["turns_expected"] == 12 * 5
    assert report["responses"] == 6 * 5 + 6  # standard: one per turn; append: one per rollout
    assert report["http_requests"] > 0 and report["http_failures"] == 0


async def test_client_processes_merge_into_one_report() -> None:
    """LOAD-3: the same load split over two client processes; the parent's report counts every
    agent's turns and responses once, and reads the server process's CPU time."""
    settings = LoadSettings(connections=6, turns=3, http_clients=3, client_processes=2)
    report = await main_load(settings)
    assert report["lost"] == 0 and report["misordered"] == 0 and report["errors"] == []
    assert report["turns"] == report["turns_expected"] == 6 * 4
    assert report["responses"] == 3 * 4 + 3
    assert report["settings"]["client_processes"] == 2
    assert report["http_requests"] > 0 and report["http_failures"] == 0
    assert report["server_cpu_s"] is not None and len(report["server_cpu_s_per_process"]) == 1


async def test_two_keys_flood_is_refused_with_headers() -> None:
    """RATE-9: ``--load-two-keys``: the flooding key is answered 429 with correct headers (every
    refusal checked), past its 10 admitted requests; the calm key's agents lose nothing."""
    from clients.bench.suites.keys_load import FLOOD_LIMIT, run_two_keys

    report = await run_two_keys(LoadSettings(connections=4, turns=4), flooders=2)
    answers = report["flood_answers"]
    assert answers.get("bad_429", 0) == 0 and answers.get("429", 0) > 0
    assert answers.get("200", 0) <= FLOOD_LIMIT
    assert report["calm_p99_ms_alone"] is not None and report["calm_p99_ms_flooded"] is not None
