"""The bench's pure parts: the looping model, timing arithmetic, the lean decoder, the report."""

from __future__ import annotations

import argparse
import asyncio
import io
import math

import msgspec
import pytest
from rich.console import Console

from clients.bench import report, table
from clients.bench.cli import add_bench_parser, scenario_config
from clients.bench.lean_wire import RawTurnReader
from clients.bench.measure import simulator_ttft_s
from clients.bench.progress import RunProgress
from clients.bench.scenario import (
    SCRIPT_CALLS,
    Call,
    coding_model,
    scale_output,
)
from clients.bench.suites import codex
from clients.bench.suites.codex import codex_model
from clients.bench.transports import MODES
from engine.conversation.context import Context
from engine.models.base import Finish, SampleRequest, TextDelta
from engine.models.sim.bench_models import (
    CODEX_STEPS,
    BenchModels,
    CodexAgent,
    LongTextModel,
    LoopingCodingAgent,
    bench_router,
)
from engine.models.sim.scenarios import CODING_AGENT_STEPS
from protocol.codec import parse_input
from protocol.tools import FunctionTool


def _request(outputs: int, model: str = "m") -> SampleRequest:
    items: list[dict[str, object]] = [{"type": "message", "role": "user", "content": "go"}]
    for i in range(outputs):
        items.append({"type": "function_call", "call_id": f"c{i}", "name": "x", "arguments": "{}"})
        items.append({"type": "function_call_output", "call_id": f"c{i}", "output": "ok"})
    return SampleRequest(
        model=model,
        context=Context(items=parse_input(items), answered={f"c{i}" for i in range(outputs)}),
        tools=[],
        tool_choice="auto",
        parallel_tool_calls=False,
        max_output_tokens=None,
    )


def test_looping_agent_repeats_the_script_then_answers() -> None:
    model = LoopingCodingAgent(0.0, calls=SCRIPT_CALLS + 3)
    assert model.plan(_request(0)).calls[0].name == CODING_AGENT_STEPS[0].name
    assert model.plan(_request(SCRIPT_CALLS + 1)).calls[0].name == CODING_AGENT_STEPS[1].name
    final = model.plan(_request(SCRIPT_CALLS + 3))
    assert final.calls == [] and final.text


def test_dispatch_picks_models_by_name() -> None:
    models = BenchModels(0.0)
    assert isinstance(models.pick(coding_model(40)), LoopingCodingAgent)
    assert isinstance(models.pick("bench-text/12"), LongTextModel)
    assert models.pick("anything") is models.fallback


def test_long_text_model_streams_exactly_n_tokens() -> None:
    async def collect() -> list[object]:
        return [d async for d in LongTextModel(0.0, 300).stream(_request(0))]

    deltas = asyncio.run(collect())
    assert sum(isinstance(d, TextDelta) for d in deltas) == 300
    assert deltas[-1] == Finish("stop", 300)


def test_simulator_ttft_follows_the_pacer() -> None:
    assert simulator_ttft_s(0) == 0.0
    assert math.isclose(simulator_ttft_s(1000), 0.001)
    assert math.isclose(simulator_ttft_s(65), 1 / 65)
    assert simulator_ttft_s(4000) == 0.0  # 0.25 ms: the pacer does not sleep that little


def test_bench_router_keeps_the_simulator_routes() -> None:
    router = bench_router(0.0)
    assert router.models() == ["sim", "sim-coding-agent"]
    assert isinstance(router.resolve("bench-text/3"), BenchModels)
    assert router.resolve("sim") is not router.resolve("bench-text/3")


def test_turn_reader_records_first_delta_and_calls() -> None:
    reader = RawTurnReader(1.0, append=False)
    call = {"type": "function_call", "call_id": "c1", "name": "read_file", "arguments": "{}"}
    events: list[dict[str, object]] = [
        {"type": "response.created"},
        {"type": "response.output_item.added"},
        {"type": "response.function_call_arguments.delta"},
        {"type": "response.function_call_arguments.delta"},
        {"type": "response.completed", "response": {"id": "r1", "output": [call]}},
    ]
    ends = [reader.feed(msgspec.json.encode(e), 2.0 + i) for i, e in enumerate(events)]
    assert ends == [False, False, False, False, True]
    turn = reader.turn
    assert (turn.t_first_item, turn.t_first_delta, turn.t_end) == (3.0, 4.0, 6.0)
    assert turn.response_id == "r1" and turn.calls[0].name == "read_file"


def test_scale_output_is_identity_at_one() -> None:
    assert scale_output("abc", 1) == "abc"
    assert scale_output("abc", 3).count("abc") == 3


def _run(
    mode: str, e2e: float, overhead: list[float], server_ms: float = 0.05
) -> dict[str, object]:
    return {
        "mode": mode,
        "tps": 1000.0,
        "e2e_s": e2e,
        "per_turn_overhead_ms": overhead,
        "ttft_ms": [v + 1 for v in overhead],
        "history_tokens": 50_000,
        "server_pre_inference_ms": [server_ms for _ in overhead],
        "server_dispatch_ms": [server_ms for _ in overhead],
        "server_cpu_ms": [10 * server_ms for _ in overhead],
    }


def test_summary_ratios_and_targets() -> None:
    runs = [
        _run("http_stateless", 2.0, [5.0, 40.0]),
        _run("http_previous_id", 1.5, [5.0, 20.0]),
        _run("ws_compat", 1.0, [0.4, 0.4]),
        _run("ws_append", 1.0, [0.4, 0.39]),
    ]
    [block] = report.summarize(runs)
    compat = block["modes"]["ws_compat"]
    assert compat["e2e_speedup_vs_stateless"] == 2.0
    assert compat["last_turn_overhead_ratio_stateless_over_mode"] == 100.0
    assert compat["server_pre_inference_median_ms"] == 0.05
    targets = {t["target"].split(" @")[0]: t["met"] for t in report.scenario_targets([block])}
    assert all(targets.values()), targets
    assert any("median overhead, 50,000 tokens" in name for name in targets)
    assert any("server pre-inference+dispatch" in name for name in targets)
    runs[2] = _run("ws_compat", 1.0, [0.4, 0.4], server_ms=0.2)  # 0.4 ms > 0.15: missed
    missed = [t for t in report.scenario_targets(report.summarize(runs)) if not t["met"]]
    assert {t["target"].split(",")[0] for t in missed} == {
        "ws_compat server pre-inference+dispatch",
        "ws_compat server CPU/turn",
    }


def test_bench_parser_attaches_to_a_subcommand() -> None:
    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "--quick", "--json", "out.json"])
    assert args.command == "bench" and args.quick and str(args.json) == "out.json"


def test_overhead_split_by_new_item_size() -> None:
    run = _run("ws_compat", 1.0, [9.0, 1.0, 3.0, 1.2, 3.4])
    run["new_tokens"] = [40, 18, 900, 18, 800]  # turn 0 (the full create) is left out
    [block] = report.summarize([run])
    row = block["modes"]["ws_compat"]
    assert row["overhead_small_new_median_ms"] == 1.1
    assert row["overhead_large_new_median_ms"] == 3.2


def test_report_in_a_log_is_plain_and_unwrapped() -> None:
    """Not a terminal (a CI log): no control codes, one line per mode row, targets marked."""
    runs = [_run(mode, 1.0 + i, [1.0, 2.0]) for i, mode in enumerate(MODES)]
    summary = report.summarize(runs)
    doc = {"summary": summary, "targets": report.scenario_targets(summary)}
    out = io.StringIO()
    table.render(doc, Console(file=out, width=table.PLAIN_WIDTH))
    text = out.getvalue()
    assert "\x1b" not in text
    assert "── 1000 tokens/s · 2 model turns · 50,000 tokens of history at the last turn" in text
    rows = [line.split() for line in text.splitlines()]
    rows = [row for row in rows if row and row[0] in MODES and row[1][0].isdigit()]
    assert [row[0] for row in rows] == list(MODES)
    assert all(len(row) == 13 for row in rows)  # mode and its 12 figures, on one line
    assert "[MISSED] e2e saved, ws_compat vs keep-alive stateless @1000" in text


def test_progress_in_a_log_prints_one_line_per_run() -> None:
    out = io.StringIO()
    with RunProgress(2, Console(file=out)) as progress:
        for label in ("ws_compat @ 0 tok/s", "ws_append @ 0 tok/s"):
            progress.start(label, 3)
            progress.turn(1)
            progress.finish("e2e 0.100 s, " + "x" * 100)
    lines = out.getvalue().splitlines()
    assert lines == [
        "[1/2] ws_compat @ 0 tok/s: e2e 0.100 s, " + "x" * 100,
        "[2/2] ws_append @ 0 tok/s: e2e 0.100 s, " + "x" * 100,
    ]


def test_codex_model_cycles_the_client_tools_then_answers() -> None:
    """Every call the server's codex model makes names a tool the client defines."""
    model = BenchModels(0.0).pick(codex_model(len(CODEX_STEPS) + 2))
    assert isinstance(model, CodexAgent)
    names = {model.plan(_request(n)).calls[0].name for n in range(len(CODEX_STEPS) + 2)}
    assert names == {name for name, _ in CODEX_STEPS} and names <= set(codex.TOOL_NAMES)
    final = model.plan(_request(len(CODEX_STEPS) + 2))
    assert final.calls == [] and final.text


def test_codex_request_is_codex_sized() -> None:
    tools = codex.CodexTools()
    body = tools.first_request(codex_model(60))
    assert 14_000 <= len(body["instructions"]) <= 15_000
    assert len(body["tools"]) >= 10
    nested = [t for t in body["tools"] if "object" in str(t["parameters"]["properties"])]
    assert len(nested) >= 6  # objects inside the parameters, not flat string arguments
    msgspec.convert(body["tools"], list[FunctionTool])  # valid tool definitions


async def test_codex_outputs_follow_the_size_schedule() -> None:
    tools = codex.CodexTools()
    calls = [Call(f"c{i}", CODEX_STEPS[i % len(CODEX_STEPS)][0], "{}") for i in range(28)]
    results = [r for call in calls for r in await tools.run([call])]
    sizes = [len(r.output) for r in results]
    assert min(sizes) >= 200 and max(sizes) <= 8000
    again = await codex.CodexTools().run(calls[:1])
    assert again[0].output == results[0].output  # every mode gets the same bytes


def test_store_runs_compare_whole_turns_paired_by_index() -> None:
    """BENCH-6: store on vs off is judged on whole turns, turn i against turn i (a write that
    leaves with the last delta's frames is invisible to the tail), beside the overhead + tail
    figures."""
    off = {
        **_run("ws_compat", 1.0, [1.0, 1.0, 1.0]),
        "tail_ms": [0.1, 0.1, 0.1],
        "turn_ms": [20.0, 35.0, 10.0],
    }
    on = {
        **_run("ws_compat_store", 1.1, [1.0, 1.0, 1.0]),
        "tail_ms": [0.3, 0.3, 0.4],
        "turn_ms": [20.1, 35.5, 10.2],
    }
    [block] = report.summarize([off, on])
    assert block["store_turn_on_minus_off_median_ms"] == pytest.approx(0.2)
    assert block["store_turn_on_minus_off_last_ms"] == pytest.approx(0.2)
    assert block["store_on_minus_off_median_ms"] == pytest.approx(0.2)
    assert block["store_tail_on_minus_off_median_ms"] == pytest.approx(0.2)
    assert block["store_last_over_first"] == pytest.approx(1.4 / 1.3)
    targets = {t["target"].split(" @")[0]: t for t in report.scenario_targets([block])}
    assert targets["store on - off median turn time"]["met"] is True
    assert targets["ws_compat_store last/first turn overhead"]["met"] is True
    on["turn_ms"] = [20.5, 35.0, 10.6]  # +0.5 and +0.6 ms in two turns of three: missed
    [block] = report.summarize([off, on])
    targets = {t["target"].split(" @")[0]: t for t in report.scenario_targets([block])}
    assert targets["store on - off median turn time"]["value"] == pytest.approx(0.5)
    assert targets["store on - off median turn time"]["met"] is False


def test_store_flag_adds_the_stored_mode() -> None:
    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers(dest="command"))
    config = scenario_config(parser.parse_args(["bench", "--store", "sqlite", "--quick"]))
    assert config.store == "sqlite" and config.modes[-1] == "ws_compat_store"
    plain = scenario_config(parser.parse_args(["bench", "--quick"]))
    assert plain.store == "memory" and "ws_compat_store" not in plain.modes


def test_targets_of_a_run_without_append_mode() -> None:
    """``--modes`` may leave ``ws_append`` out: the compat targets that need it are skipped,
    the others still reported (a run at 65 tok/s without append once crashed here)."""
    base = _run("http_stateless", 2.0, [5.0, 9.0, 12.0])
    compat = _run("ws_compat", 1.0, [1.0, 1.0, 1.1])
    [block] = report.summarize([base, compat])
    names = [t["target"].split(" @")[0] for t in report.scenario_targets([block])]
    assert "ws_compat last/first overhead" in names
    assert "ws_compat vs ws_append median overhead" not in names
