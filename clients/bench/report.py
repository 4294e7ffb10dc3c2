"""From runs to figures: repeats combined, per-speed summaries, ratios, and the issue's targets.

Everything here works on the JSON document (``{"settings", "runs", ...}``), so a saved JSON
file can be re-summarised and re-plotted without running anything again. Medians throughout:
the machine is shared and noisy, and a median of per-turn values is robust to a stray stall.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from clients.bench.measure import SERVER_STAGES, RunResult

BASELINE = "http_stateless"
Doc = dict[str, Any]


def combine(results: list[RunResult]) -> Doc:
    """One JSON run from R repeats of the same (mode, speed): per-turn and e2e medians."""
    docs = [r.as_json() for r in results]
    run = dict(docs[0])
    run["repeats"] = len(docs)
    run["e2e_s"] = round(statistics.median(d["e2e_s"] for d in docs), 6)
    run["e2e_s_all"] = [d["e2e_s"] for d in docs]
    run["tool_s"] = round(statistics.median(d["tool_s"] for d in docs), 6)
    for key in (
        "per_turn_overhead_ms",
        "ttft_ms",
        "first_item_ms",
        "turn_ms",
        "tail_ms",
        "server_cpu_ms",
        "server_wait_ms",
        "server_written_bytes",
        *(f"server_{stage}_ms" for stage in SERVER_STAGES),
    ):
        if any(key not in d for d in docs):
            continue
        run[key] = [_median_or_none(values) for values in zip(*(d[key] for d in docs), strict=True)]
    counted = [d["instructions_per_turn"] for d in docs if d.get("instructions_per_turn")]
    if len(counted) == len(docs):  # BENCH-13: the median over repeats, and each repeat's
        run["instructions_per_turn"] = statistics.median(counted)
        run["instructions_per_turn_all"] = counted
    return run


def instruction_lines(runs: list[Doc]) -> list[str]:
    """BENCH-13: each (mode, speed)'s instructions per model turn and its ratio to the first
    mode's at that speed; nothing when the server was not counted."""
    lines: list[str] = []
    first: dict[float, float] = {}
    for run in runs:
        count = run.get("instructions_per_turn")
        if not count:
            continue
        if not lines:
            lines.append("instructions per model turn (callgrind, BENCH-13; wall and CPU are not)")
        base = first.setdefault(run["tps"], count)
        lines.append(
            f"  {run['mode']:<18} @ {run['tps']:g} tok/s {count / 1e6:9.3f} M  {count / base:5.2f}"
        )
    return lines


def _median_or_none(values: tuple[float | None, ...]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 4) if present else None


def median(values: list[float | None]) -> float:
    present = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(present) if present else math.nan


def _edge(values: list[float | None], last: bool) -> float:
    present = [v for v in values if v is not None]
    if not present:
        return math.nan
    return present[-1] if last else present[0]


def summarize(runs: list[Doc]) -> list[Doc]:
    """Per speed: each mode's headline figures and its ratios against ``http_stateless``."""
    out: list[Doc] = []
    for tps in sorted({r["tps"] for r in runs}):
        at = {r["mode"]: r for r in runs if r["tps"] == tps}
        base = at.get(BASELINE)
        modes = {mode: _mode_summary(run, base) for mode, run in at.items()}
        out.append({"tps": tps, "modes": modes, **_pair_ratios(modes), **_store_turns(at)})
    return out


def _mode_summary(run: Doc, base: Doc | None) -> Doc:
    overhead = run["per_turn_overhead_ms"]
    row: Doc = {
        "e2e_s": run["e2e_s"],
        "overhead_first_ms": _edge(overhead, last=False),
        "overhead_median_ms": median(overhead),
        "overhead_last_ms": _edge(overhead, last=True),
        "ttft_median_ms": median(run["ttft_ms"]),
        "first_item_median_ms": median(run.get("first_item_ms", [])),
        "tail_median_ms": median(run.get("tail_ms", [])),
        **_turn_overhead(overhead, run.get("tail_ms", [])),
        "server_cpu_median_ms": median(run.get("server_cpu_ms", [])),
        "server_cpu_last_ms": _edge(run.get("server_cpu_ms", []), last=True),
        "server_wait_median_ms": median(run.get("server_wait_ms", [])),
        "server_written_median_kib": median(run.get("server_written_bytes", [])) / 1024,
        # The server's own clocks (OBS-5): its stages beside the client-side overhead.
        **{
            f"server_{stage}_median_ms": median(run.get(f"server_{stage}_ms", []))
            for stage in SERVER_STAGES
        },
        "history_tokens": run.get("history_tokens"),
        "turns": len(overhead),
        **_by_new_size(overhead, run.get("new_tokens", [])),
    }
    if base is not None:
        base_last = _edge(base["per_turn_overhead_ms"], last=True)
        row["e2e_speedup_vs_stateless"] = base["e2e_s"] / run["e2e_s"]
        row["e2e_time_saved_pct"] = 100.0 * (1.0 - run["e2e_s"] / base["e2e_s"])
        row["last_turn_overhead_ratio_stateless_over_mode"] = _ratio(
            base_last, row["overhead_last_ms"]
        )
    return row


def _turn_overhead(overhead: list[float | None], tail: list[float | None]) -> Doc:
    """The server's whole share of a turn: before the model's first delta (``overhead``) and
    after its last (``tail``: closing events and, with ``store: true``, the durable write)."""
    if len(tail) != len(overhead):
        return {}
    total: list[float | None] = [
        None if a is None or b is None else a + b for a, b in zip(overhead, tail, strict=True)
    ]
    return {
        "turn_overhead_first_ms": _edge(total, last=False),
        "turn_overhead_median_ms": median(total),
        "turn_overhead_last_ms": _edge(total, last=True),
    }


SMALL_NEW, LARGE_NEW = 100, 500  # tokens a turn adds: an edit's reply vs a file read


def _by_new_size(overhead: list[float | None], new_tokens: list[int]) -> Doc:
    """Median overhead of turns that added little vs a lot: separates the fixed per-turn cost
    from the cost that grows with the new items (tokenising and scanning them)."""
    if len(new_tokens) != len(overhead):
        return {}
    pairs = list(zip(new_tokens[1:], overhead[1:], strict=True))  # turn 0 is the full create
    small = [v for n, v in pairs if n < SMALL_NEW]
    large = [v for n, v in pairs if n >= LARGE_NEW]
    return {
        "overhead_small_new_median_ms": median(small),
        "overhead_large_new_median_ms": median(large),
        "large_new_median_tokens": median([float(n) for n, _ in pairs if n >= LARGE_NEW]),
    }


def _pair_ratios(modes: dict[str, Doc]) -> Doc:
    return {**_store_ratios(modes), **_compat_append_ratios(modes)}


def _store_ratios(modes: dict[str, Doc]) -> Doc:
    """The durable write's cost per turn: ``ws_compat`` with and without ``store`` (BENCH-6)."""
    stored, compat = modes.get("ws_compat_store"), modes.get("ws_compat")
    if stored is None or "turn_overhead_median_ms" not in stored:
        return {}
    first, last = stored["turn_overhead_first_ms"], stored["turn_overhead_last_ms"]
    out = {"store_last_over_first": _ratio(last, first)}
    if compat is not None and "turn_overhead_median_ms" in compat:
        out["store_on_minus_off_median_ms"] = (
            stored["turn_overhead_median_ms"] - compat["turn_overhead_median_ms"]
        )
        out["store_on_minus_off_last_ms"] = last - compat["turn_overhead_last_ms"]
        out["store_tail_on_minus_off_median_ms"] = (
            stored["tail_median_ms"] - compat["tail_median_ms"]
        )
    return out


def _store_turns(runs: dict[str, Doc]) -> Doc:
    """The durable write's whole cost per turn, paired by turn: turn ``i`` of ``ws_compat_store``
    minus turn ``i`` of ``ws_compat`` (request sent -> terminal event; the simulator paces both
    identically). The tail alone cannot show a write committed in the same event-loop iteration
    as the last delta (STORE-13): the frames leave together, so the write delays the delta too."""
    stored, compat = runs.get("ws_compat_store"), runs.get("ws_compat")
    if stored is None or compat is None or len(stored["turn_ms"]) != len(compat["turn_ms"]):
        return {}
    deltas: list[float | None] = [
        None if a is None or b is None else a - b
        for a, b in zip(stored["turn_ms"], compat["turn_ms"], strict=True)
    ]
    return {
        "store_turn_on_minus_off_median_ms": median(deltas),
        "store_turn_on_minus_off_last_ms": _edge(deltas, last=True),
    }


def _compat_append_ratios(modes: dict[str, Doc]) -> Doc:
    compat, append = modes.get("ws_compat"), modes.get("ws_append")
    if compat is None:
        return {}
    out = {
        "ws_compat_last_over_first": _ratio(
            compat["overhead_last_ms"], compat["overhead_first_ms"]
        ),
    }
    if append is not None:  # a run of some modes only (--modes) may leave append out
        diff = compat["overhead_median_ms"] - append["overhead_median_ms"]
        out["ws_compat_vs_append_overhead_diff_pct"] = 100.0 * _ratio(
            diff, append["overhead_median_ms"]
        )
    return out


def _ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(b) and b > 0 else math.nan


def _target(name: str, value: float, limit: float, met: bool, unit: str = "") -> Doc:
    return {"target": name, "value": value, "limit": limit, "met": bool(met), "unit": unit}


def store_targets(summary: list[Doc]) -> list[Doc]:
    """Durable writes stay flat and cheap (issue 10): last/first ≤ 1.5x, ≤ +0.3 ms median."""
    out: list[Doc] = []
    for block in summary:
        tps = block["tps"]
        if "store_last_over_first" in block:
            flat = block["store_last_over_first"]
            out.append(
                _target(
                    f"ws_compat_store last/first turn overhead @{tps:g}",
                    flat,
                    1.5,
                    flat <= 1.5,
                    "x",
                )
            )
        if "store_turn_on_minus_off_median_ms" in block:
            extra = block["store_turn_on_minus_off_median_ms"]
            out.append(
                _target(f"store on - off median turn time @{tps:g}", extra, 0.3, extra <= 0.3, "ms")
            )
    return out


def scenario_targets(summary: list[Doc]) -> list[Doc]:
    """Issue 11's scenario targets (and issue 10's store targets), evaluated wherever this run
    has the data for them. They are reported, never asserted: a miss is a finding
    (docs/benchmark.md says what floors them)."""
    out: list[Doc] = store_targets(summary)
    for block in summary:
        compat = block["modes"].get("ws_compat")
        if compat is None or "e2e_speedup_vs_stateless" not in compat:
            continue
        tps = block["tps"]
        at = f"@{tps:g}"
        if tps == 1000:
            saved = compat["e2e_time_saved_pct"]
            out.append(_target(f"e2e saved, ws_compat vs keep-alive stateless {at}", saved,
                               50.0, saved >= 50.0, "%"))  # fmt: skip
        flat = block["ws_compat_last_over_first"]
        out.append(_target(f"ws_compat last/first overhead {at}", flat, 1.2, flat <= 1.2, "x"))
        lower = compat["last_turn_overhead_ratio_stateless_over_mode"]
        out.append(_target(f"stateless/ws_compat last-turn overhead {at}", lower, 50.0,
                           lower >= 50.0, "x"))  # fmt: skip
        if "ws_compat_vs_append_overhead_diff_pct" in block:
            diff = block["ws_compat_vs_append_overhead_diff_pct"]
            out.append(_target(f"ws_compat vs ws_append median overhead {at}", diff, 5.0,
                               abs(diff) <= 5.0, "%"))  # fmt: skip
        if (compat.get("history_tokens") or 0) < 40_000:
            continue
        size = f"{compat['history_tokens']:,} tokens {at}"
        med = compat["overhead_median_ms"]
        out.append(_target(f"ws_compat median overhead, {size}", med, 0.5, med <= 0.5, "ms"))
        pre = compat["server_pre_inference_median_ms"] + compat["server_dispatch_median_ms"]
        out.append(_target(f"ws_compat server pre-inference+dispatch, {size}", pre, 0.15,
                           pre <= 0.15, "ms"))  # fmt: skip
        cpu = compat["server_cpu_median_ms"]
        out.append(_target(f"ws_compat server CPU/turn, {size}", cpu, 1.0, cpu <= 1.0, "ms"))
    return out


def stream_targets(stream: Doc) -> list[Doc]:
    out: list[Doc] = []
    single = stream.get("single")
    if single:
        rates = (single["achieved_tps"], single["achieved_tps_from_request"])
        error = max(100.0 * abs(rate / single["model_tps"] - 1.0) for rate in rates)
        out.append(_target("single-connection rate vs model", error, 5.0, error <= 5.0, "% off"))
    many = stream.get("many")
    if many:
        rate = many["delta_events_per_s"]
        out.append(_target("delta events/s, one server process", rate, 100_000, rate >= 100_000))
        # What one process delivers per second of its own CPU: its rate with a core to itself
        # (the wall rate above is bounded by whatever else this shared machine runs).
        per_cpu = many.get("delta_events_per_server_cpu_s") or math.nan
        out.append(_target("delta events per server CPU-second", per_cpu, 100_000,
                           per_cpu >= 100_000))  # fmt: skip
    return out


def memory_targets(memory: Doc) -> list[Doc]:
    ratio = memory["rss_over_raw"]
    return [_target("suspended-rollout RSS / raw state", ratio, 2.0, ratio <= 2.0, "x")]


def clean(value: Any) -> Any:
    """NaN/inf -> None, recursively (JSON has no NaN)."""
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean(v) for v in value]
    return value
