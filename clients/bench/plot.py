"""The PNG: per-turn server overhead (ms, log scale) against turn index, one panel per speed.

matplotlib is imported here only, and only when a PNG is asked for, with the Agg backend (no
display needed). The x axis is the turn index, which is also the history length: every turn adds
one tool call and its output.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from clients.bench.modes import ALL_MODES

FLOOR_MS = 0.01  # log axis: values at or below zero (timer granularity) are drawn here
COLORS = {
    "http_stateless": "#d62728",
    "http_previous_id": "#ff7f0e",
    "ws_compat": "#1f77b4",
    "ws_append": "#2ca02c",
    "http_stateless_cold": "#9467bd",
}


def write_png(path: Path, runs: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    speeds = sorted({r["tps"] for r in runs})
    fig, axes = plt.subplots(1, len(speeds), figsize=(5.5 * len(speeds), 4.2), squeeze=False)
    for ax, tps in zip(axes[0], speeds, strict=True):
        for mode in ALL_MODES:
            for run in (r for r in runs if r["tps"] == tps and r["mode"] == mode):
                values = [
                    max(v, FLOOR_MS) if v is not None else None for v in run["per_turn_overhead_ms"]
                ]
                xs = [i for i, v in enumerate(values) if v is not None]
                ys = [v for v in values if v is not None]
                ax.plot(xs, ys, label=mode, color=COLORS[mode], linewidth=1.4, marker=".")
        ax.set_yscale("log")
        ax.set_title(f"{tps:g} tokens/s")
        ax.set_xlabel("turn index (history grows →)")
        ax.set_ylabel("server overhead before first token (ms)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("per-turn server overhead = TTFT - simulator TTFT", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
