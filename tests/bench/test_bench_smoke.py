"""A tiny real benchmark run: its own server subprocess, every mode, JSON and PNG written.

No timing is asserted (the machine is shared); only that the run completes and its outputs have
the documented layout.
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
import sys
from pathlib import Path

import pytest

from clients.bench.cli import main
from clients.bench.transports import MODES

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_scenario_run_writes_json_and_png(tmp_path: Path) -> None:
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    argv = ["--speeds", "0", "--turns", "3", "--json", str(out), "--png", str(png)]
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["settings"]["tool_calls"] == 3
    assert [r["mode"] for r in doc["runs"]] == list(MODES)
    for run in doc["runs"]:
        assert run["tps"] == 0
        assert run["e2e_s"] > 0
        assert run["tool_calls"] == 3
        assert len(run["per_turn_overhead_ms"]) == len(run["ttft_ms"]) == 4
        assert run["history_tokens"] > 1000
    assert {r["history_tokens"] for r in doc["runs"]} == {doc["runs"][0]["history_tokens"]}
    assert doc["summary"][0]["modes"]["ws_compat"]["e2e_speedup_vs_stateless"] > 0
    assert png.read_bytes()[:8] == PNG_SIGNATURE


@pytest.mark.parametrize("store", ["memory", "sqlite", "redis"])
def test_store_run_adds_the_stored_mode(tmp_path: Path, store: str) -> None:
    """BENCH-6: ``--store`` puts the server on that store and adds ``ws_compat_store``."""
    out = tmp_path / "store.json"
    argv = ["--speeds", "0", "--turns", "2", "--modes", "ws_compat", "--repeat", "1"]
    assert main([*argv, "--store", store, "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["settings"]["store"] == store
    assert [r["mode"] for r in doc["runs"]] == ["ws_compat", "ws_compat_store"]
    assert all(len(r["tail_ms"]) == 3 for r in doc["runs"])
    assert "store_on_minus_off_median_ms" in doc["summary"][0]


def test_stream_and_memory_runs_report(tmp_path: Path) -> None:
    out = tmp_path / "extras.json"
    argv = [
        "--stream", "--memory", "--json", str(out),
        "--stream-tokens", "400", "--stream-connections", "2", "--stream-seconds", "0.3",
        "--memory-rollouts", "6", "--memory-tokens", "3000", "--memory-lanes", "4",
    ]  # fmt: skip
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["runs"] == []
    assert doc["stream"]["single"]["tokens"] == 400
    assert doc["stream"]["many"]["delta_events"] > 0
    memory = doc["memory"]
    assert memory["rollouts"] == 6 and memory["connections"] == 2
    assert memory["tokens_per_rollout"] >= 3000
    assert memory["raw_bytes"] == memory["token_bytes"] + memory["item_bytes"]
    assert {t["target"] for t in doc["targets"]} >= {"suspended-rollout RSS / raw state"}


def test_peers_run_with_the_engine_alone(tmp_path: Path) -> None:
    """BENCH-10: ``--peers`` with the engine as its only target (the peers are an optional
    extra): the stub upstream, every transport, the table's figures and both outputs."""
    out, png = tmp_path / "peers.json", tmp_path / "peers.png"
    argv = ["--peers", "--peers-targets", "engine", "--turns", "2", "--repeat", "1"]
    assert main([*argv, "--json", str(out), "--png", str(png)]) == 0
    doc = json.loads(out.read_text())
    assert list(doc["summary"]) == ["engine/ws", "engine/http_previous_id", "engine/http_stateless"]
    assert doc["unsupported"] == {}
    for run in doc["runs"]:
        assert len(run["wall_ms"]) == len(run["server_cpu_ms"]) == len(run["stub_cpu_ms"]) == 2
        assert min(run["server_cpu_ms"]) > 0
    assert doc["summary"]["engine/ws"]["server_cpu_ms_vs_engine_ws"] == 1.0
    assert png.read_bytes()[:8] == PNG_SIGNATURE


def test_peers_callgrind_counts_each_chain(tmp_path: Path) -> None:
    """BENCH-12: under ``--peers-callgrind`` every measured chain carries its instructions per
    turn, counted from the chain's own turns only (start-up and the warm-up are not in it), so
    two chains of the same turns count about the same."""
    out = tmp_path / "counted.json"
    argv = ["--peers", "--peers-callgrind", "--peers-targets", "engine", "--peers-transports",
            "ws", "--turns", "2", "--repeat", "2", "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    counts = [run["instructions_per_turn"] for run in doc["runs"]]
    assert len(counts) == 2
    assert all(2e5 < count < 2e8 for count in counts)  # a turn, not a start-up or nothing
    assert max(counts) / min(counts) < 1.25
    assert doc["summary"]["engine/ws"]["instructions_vs_engine_ws"] == 1.0


def test_scenario_callgrind_counts_each_mode(tmp_path: Path) -> None:
    """BENCH-13: under ``--callgrind`` the scenario's server runs under callgrind and each
    mode's run carries its instructions per model turn, counted from that run's own turns
    (the warm-up and the other mode's runs are not in it), so two repeats of one mode count
    about the same."""
    out = tmp_path / "codex.json"
    argv = ["--scenario", "codex", "--speeds", "0", "--modes", "ws_append,ws_compat",
            "--turns", "3", "--repeat", "2", "--callgrind", "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    assert [run["mode"] for run in doc["runs"]] == ["ws_append", "ws_compat"]
    for run in doc["runs"]:
        counts = run["instructions_per_turn_all"]
        assert len(counts) == 2
        assert all(5e5 < count < 1e8 for count in counts)  # a turn, not a start-up or nothing
        assert max(counts) / min(counts) < 1.25
        assert run["instructions_per_turn"] == statistics.median(counts)


BESIDE = Path(sys.executable).parent


def test_peers_run_agentic_api_on_every_transport(tmp_path: Path) -> None:
    """BENCH-10: a real peer beside the engine, vllm-project's Rust agentic-server, in front of
    the same stub: it runs the chain on all three transports (its WebSocket mode, HTTP
    ``previous_response_id``, stateless; none refused), its version is read, and the CPU of its
    process is counted each turn."""
    found = shutil.which("agentic-server") or (BESIDE / "agentic-server").exists()
    assert found, "agentic-server is missing: `make install` (the dev extra) brings agentic-api"
    out = tmp_path / "agentic.json"
    argv = ["--peers", "--peers-targets", "engine,agentic-api", "--turns", "2", "--repeat", "1"]
    assert main([*argv, "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["skipped"] == {} and doc["unsupported"] == {}
    assert [k for k in doc["summary"] if k.startswith("agentic-api/")] == [
        "agentic-api/ws", "agentic-api/http_previous_id", "agentic-api/http_stateless",
    ]  # fmt: skip
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", doc["settings"]["versions"]["agentic-api"])
    for run in doc["runs"]:
        assert len(run["server_cpu_ms"]) == 2
        assert min(run["server_cpu_ms"]) > 0
    assert "server_cpu_ms_vs_engine_ws" in doc["summary"]["agentic-api/ws"]
