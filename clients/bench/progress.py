"""Progress on stderr: a redrawn bar on a terminal, one plain line per finished run otherwise.

stderr, so ``--json -`` style piping and the final table on stdout stay clean. Drawing is cheap
and happens between turns (after the turn's clock stopped), never inside a measured interval.
"""

from __future__ import annotations

import sys
from typing import TextIO

WIDTH = 28


class Progress:
    def __init__(self, total_runs: int, out: TextIO | None = None) -> None:
        self.out = out or sys.stderr
        self.tty = self.out.isatty()
        self.total = max(total_runs, 1)
        self.done = 0
        self.label = ""
        self.turns = 0

    def start(self, label: str, turns: int) -> None:
        self.label, self.turns = label, turns
        self._draw(0)

    def turn(self, index: int) -> None:
        self._draw(index)

    def finish(self, summary: str) -> None:
        self.done += 1
        if self.tty:
            self.out.write("\r\x1b[2K")
        self.out.write(f"[{self.done}/{self.total}] {self.label}: {summary}\n")
        self.out.flush()

    def _draw(self, index: int) -> None:
        if not self.tty:
            return
        share = (self.done + min(index / max(self.turns, 1), 1.0)) / self.total
        filled = int(WIDTH * share)
        bar = "█" * filled + "·" * (WIDTH - filled)
        self.out.write(
            f"\r\x1b[2K[{bar}] {self.done}/{self.total} {self.label} turn {index}/{self.turns}"
        )
        self.out.flush()
