"""The PNG: per-turn server overhead (ms, log scale) against turn index, one panel per speed.

matplotlib is imported here only, and only when a PNG is asked for, with the Agg backend (no
display needed). The x axis is the turn index, which is also the history length: every turn adds
one tool call and its output.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from clients.bench.transports import ALL_MODES

FLOOR_MS = 0.01  # log axis: values at or below zero (timer granularity) are drawn here
COLORS = {
    "http_stateless": "#d62728",
    "http_previous_id": "#ff7f0e",
    "ws_compat": "#1f77b4",
    "ws_append": "#2ca02c",
    "http_stateless_cold": "#9467bd",
}


def write_png(path: Path, runs: list[dict[str, Any]]) -> None:
    """Row 1: overhead per turn index, one panel per speed. Row 2, per speed: overhead against
    the history's size in the server's own token counts (log-log: the codex scenario passes
    100k), and the cumulative end-to-end time of the model turns per mode (tool time, equal in
    every mode, left out)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    speeds = sorted({r["tps"] for r in runs})
    fig, axes = plt.subplots(3, len(speeds), figsize=(5.5 * len(speeds), 12), squeeze=False)
    for column, tps in enumerate(speeds):
        at = [r for mode in ALL_MODES for r in runs if r["tps"] == tps and r["mode"] == mode]
        _overhead_by_turn(axes[0][column], at, tps)
        _overhead_by_tokens(axes[1][column], at, tps)
        _cumulative(axes[2][column], at, tps)
    fig.suptitle("per-turn server overhead = TTFT - simulator TTFT", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _points(run: dict[str, Any], xs: list[Any]) -> tuple[list[float], list[float]]:
    pairs = [
        (x, max(v, FLOOR_MS))
        for x, v in zip(xs, run["per_turn_overhead_ms"], strict=False)
        if v is not None and x is not None
    ]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _overhead_by_turn(ax: Any, runs: list[dict[str, Any]], tps: float) -> None:
    for run in runs:
        xs, ys = _points(run, list(range(len(run["per_turn_overhead_ms"]))))
        ax.plot(xs, ys, label=run["mode"], color=COLORS[run["mode"]], linewidth=1.4, marker=".")
    ax.set_yscale("log")
    ax.set_title(f"{tps:g} tokens/s")
    ax.set_xlabel("turn index (history grows →)")
    ax.set_ylabel("server overhead before first token (ms)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)


def _overhead_by_tokens(ax: Any, runs: list[dict[str, Any]], tps: float) -> None:
    for run in runs:
        tokens = run.get("prompt_tokens") or []
        if not any(t is not None for t in tokens):
            continue
        xs, ys = _points(run, tokens)
        ax.plot(xs, ys, label=run["mode"], color=COLORS[run["mode"]], linewidth=1.2, marker=".")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_title(f"overhead vs history, {tps:g} tokens/s")
    ax.set_xlabel("history tokens at the turn (server's count)")
    ax.set_ylabel("overhead (ms)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)


def _cumulative(ax: Any, runs: list[dict[str, Any]], tps: float) -> None:
    for run in runs:
        total, ys = 0.0, []
        for value in run.get("turn_ms") or []:
            total += (value or 0.0) / 1000.0
            ys.append(total)
        ax.plot(range(len(ys)), ys, label=run["mode"], color=COLORS[run["mode"]], linewidth=1.4)
    ax.set_title(f"cumulative end-to-end (model turns), {tps:g} tokens/s")
    ax.set_xlabel("turn index")
    ax.set_ylabel("seconds")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
