"""The terminal report (``rich``): one table per speed with its ratios, then streaming, memory
and every target with met/missed.

On a terminal the tables fit its width and missed targets stand out in colour; anywhere else
(a CI log, a pipe) the output is plain text at a fixed width wide enough that no row wraps.
"""

from __future__ import annotations

import math
import sys
from typing import Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from clients.bench.transports import ALL_MODES, MODES

Doc = dict[str, Any]
PLAIN_WIDTH = 200  # columns when stdout is not a terminal
# (header, summary key, digits, suffix); two-line headers group the overhead and CPU columns
COLUMNS = (
    ("e2e s", "e2e_s", 3, ""),
    ("speedup", "e2e_speedup_vs_stateless", 2, "x"),
    ("saved", "e2e_time_saved_pct", 0, "%"),
    ("overhead ms\nfirst", "overhead_first_ms", 2, ""),
    ("\nmedian", "overhead_median_ms", 2, ""),
    ("\nlast", "overhead_last_ms", 2, ""),
    ("ttft\nmed", "ttft_median_ms", 2, ""),
    ("item\nmed", "first_item_median_ms", 2, ""),
    ("server cpu/turn\nmed", "server_cpu_median_ms", 2, ""),
    ("\nlast", "server_cpu_last_ms", 2, ""),
    ("cpu\nwait", "server_wait_median_ms", 2, ""),
    ("sent KiB\n/turn", "server_written_median_kib", 1, ""),
)


def console() -> Console:
    """stdout; plain and wide enough that no row wraps when it is not a terminal."""
    return Console(highlight=False, width=None if sys.stdout.isatty() else PLAIN_WIDTH)


def _f(value: float | None, digits: int = 2, suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}{suffix}"


def speed_table(block: Doc) -> Table:
    modes: dict[str, Doc] = block["modes"]
    any_mode = next(iter(modes.values()))
    tokens = any_mode.get("history_tokens") or 0
    table = Table(
        title=f"── {block['tps']:g} tokens/s · {any_mode['turns']} model turns · "
        f"{tokens:,} tokens of history at the last turn",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    table.add_column("mode")
    for header, *_ in COLUMNS:
        table.add_column(header, justify="right")
    for mode in (m for m in ALL_MODES if m in modes):
        row = modes[mode]
        table.add_row(
            mode, *(_f(row.get(key), digits, suffix) for _, key, digits, suffix in COLUMNS)
        )
    return table


def ratio_lines(block: Doc) -> list[str]:
    modes: dict[str, Doc] = block["modes"]
    lines: list[str] = []
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
    if "store_on_minus_off_median_ms" in block:
        lines.append(
            "  store: ws_compat_store - ws_compat, whole turn paired by turn: median "
            f"{_f(block.get('store_turn_on_minus_off_median_ms'), 3, ' ms')}, last "
            f"{_f(block.get('store_turn_on_minus_off_last_ms'), 3, ' ms')}; overhead + tail "
            f"median {_f(block['store_on_minus_off_median_ms'], 3, ' ms')}, tail median "
            f"{_f(block['store_tail_on_minus_off_median_ms'], 3, ' ms')}; "
            f"ws_compat_store last/first {_f(block['store_last_over_first'], 2, 'x')}"
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


def target_lines(targets: list[Doc]) -> list[Text]:
    lines = [Text("── targets")]
    for t in targets:
        mark = Text("met   ", style="green") if t["met"] else Text("MISSED", style="bold red")
        detail = f"] {t['target']}: {_f(t['value'], 2)} {t['unit']} (limit {t['limit']:g})"
        lines.append(Text.assemble("[", mark, detail))
    return lines


def report(doc: Doc) -> Group:
    """Everything the terminal shows, in order, as one renderable."""
    parts: list[RenderableType] = []
    for block in doc.get("summary", []):
        parts += [speed_table(block), *map(Text, ratio_lines(block)), Text("")]
    if doc.get("stream"):
        parts += [*map(Text, stream_lines(doc["stream"])), Text("")]
    if doc.get("memory"):
        parts += [*map(Text, memory_lines(doc["memory"])), Text("")]
    if doc.get("targets"):
        parts += target_lines(doc["targets"])
    return Group(*parts)


def render(doc: Doc, out: Console | None = None) -> None:
    """Print the report to ``out`` (default: stdout, see ``console``)."""
    (out or console()).print(report(doc), soft_wrap=False)
