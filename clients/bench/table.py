"""The terminal report: one table per speed, the ratios, then every target with met/missed."""

from __future__ import annotations

import math
from typing import Any

from clients.bench.modes import MODES

Doc = dict[str, Any]
_HEAD = (
    f"{'mode':<17}{'e2e s':>8}{'speedup':>9}{'saved':>7}  "
    f"{'overhead ms: first':>18}{'median':>8}{'last':>8}  {'ttft med':>8}{'item med':>9}"
    f"  {'server cpu/turn: med':>20}{'last':>7}{'cpu wait':>9}"
)


def _f(value: float | None, digits: int = 2, suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}{suffix}"


def _row(mode: str, m: Doc) -> str:
    return (
        f"{mode:<17}{_f(m['e2e_s'], 3):>8}"
        f"{_f(m.get('e2e_speedup_vs_stateless'), 2, 'x'):>9}"
        f"{_f(m.get('e2e_time_saved_pct'), 0, '%'):>7}  "
        f"{_f(m['overhead_first_ms']):>18}{_f(m['overhead_median_ms']):>8}"
        f"{_f(m['overhead_last_ms']):>8}  {_f(m['ttft_median_ms']):>8}"
        f"{_f(m['first_item_median_ms']):>9}"
        f"  {_f(m.get('server_cpu_median_ms')):>20}{_f(m.get('server_cpu_last_ms')):>7}"
        f"{_f(m.get('server_wait_median_ms')):>9}"
    )


def speed_block(block: Doc) -> list[str]:
    modes: dict[str, Doc] = block["modes"]
    any_mode = next(iter(modes.values()))
    tokens = any_mode.get("history_tokens") or 0
    lines = [
        f"── {block['tps']:g} tokens/s · {any_mode['turns']} model turns · "
        f"{tokens:,} tokens of history at the last turn",
        _HEAD,
    ]
    lines += [_row(mode, modes[mode]) for mode in MODES if mode in modes]
    ratios = [
        f"{mode}: stateless/mode last-turn overhead "
        f"{_f(modes[mode].get('last_turn_overhead_ratio_stateless_over_mode'), 1, 'x')}"
        for mode in MODES[1:]
        if mode in modes
    ]
    if "http_stateless" in modes and ratios:
        lines.append("  " + " · ".join(ratios))
    # Only the incremental modes: in the full-history modes, output size and history length are
    # confounded (the large reads come early in the script, when the history is short).
    split = [
        f"{mode} {_f(modes[mode].get('overhead_small_new_median_ms'))}/"
        f"{_f(modes[mode].get('overhead_large_new_median_ms'))}"
        for mode in ("ws_compat", "ws_append")
        if mode in modes and modes[mode].get("overhead_small_new_median_ms") is not None
    ]
    if split:
        lines.append(
            "  median overhead ms after small (<100 tok) / large (>=500 tok) tool outputs: "
            + " · ".join(split)
        )
    if "ws_compat_vs_append_overhead_diff_pct" in block:
        lines.append(
            "  ws_compat vs ws_append median overhead: "
            f"{_f(block['ws_compat_vs_append_overhead_diff_pct'], 1, '%')}; "
            f"ws_compat last/first: {_f(block['ws_compat_last_over_first'], 2, 'x')}"
        )
    return lines


def stream_lines(stream: Doc) -> list[str]:
    lines = ["── streaming"]
    single = stream.get("single")
    if single:
        lines.append(
            f"one connection: {single['achieved_tps']:,.0f} tokens/s first-to-last delta, "
            f"{single['achieved_tps_from_request']:,.0f} from the request, vs "
            f"{single['model_tps']:,.0f} model ({single['tokens']:,} tokens, "
            f"TTFT {single['ttft_ms']:.1f} ms)"
        )
    many = stream.get("many")
    if many:
        lines.append(
            f"{many['connections']} connections, unlimited speed: "
            f"{many['delta_events_per_s']:,.0f} delta events/s "
            f"(server CPU {many['server_cpu_pct']:.0f}% → "
            f"{many['delta_events_per_server_cpu_s']:,.0f} per server CPU-second)"
        )
    return lines


def memory_lines(memory: Doc) -> list[str]:
    mib = 1024 * 1024
    return [
        "── memory",
        f"{memory['rollouts']:,} suspended rollouts x {memory['tokens_per_rollout']:,.0f} tokens "
        f"on {memory['connections']} connections: RSS {memory['rss_before'] / mib:,.1f} → "
        f"{memory['rss_after'] / mib:,.1f} MiB (+{memory['rss_delta'] / mib:,.1f} MiB)",
        f"raw state {memory['raw_bytes'] / mib:,.1f} MiB (tokens "
        f"{memory['token_bytes'] / mib:,.1f} + items {memory['item_bytes'] / mib:,.1f}); "
        f"RSS/raw {memory['rss_over_raw']:.2f}x",
    ]


def target_lines(targets: list[Doc]) -> list[str]:
    lines = ["── targets"]
    for t in targets:
        mark = "met   " if t["met"] else "MISSED"
        lines.append(
            f"[{mark}] {t['target']}: {_f(t['value'], 2)} {t['unit']} (limit {t['limit']:g})"
        )
    return lines


def render(doc: Doc) -> str:
    lines: list[str] = []
    for block in doc.get("summary", []):
        lines += [*speed_block(block), ""]
    if doc.get("stream"):
        lines += [*stream_lines(doc["stream"]), ""]
    if doc.get("memory"):
        lines += [*memory_lines(doc["memory"]), ""]
    if doc.get("targets"):
        lines += target_lines(doc["targets"])
    return "\n".join(lines)
