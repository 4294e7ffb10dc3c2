"""Progress on stderr (``rich``): a live bar on a terminal, and one plain line per finished run
either way (so a CI log gets the lines and no control codes).

stderr, so the final table on stdout stays clean. The bar is redrawn only when a run or a turn
starts, never by a background thread: drawing happens between turns, after the turn's clock
stopped, never inside a measured interval.
"""

from __future__ import annotations

from typing import Self

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn
from rich.progress import Progress as Bar


class RunProgress:
    def __init__(self, total_runs: int, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True, highlight=False)
        self.total = max(total_runs, 1)
        self.done = 0
        self.label = ""
        self.turns = 1
        self._bar = Bar(
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.description}", markup=False),
            console=self.console,
            auto_refresh=False,  # no drawing thread: see the module docstring
            transient=True,
            disable=not self.console.is_terminal,
        )
        self._task = self._bar.add_task("", total=self.total)

    def __enter__(self) -> Self:
        self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.stop()

    def start(self, label: str, turns: int) -> None:
        self.label, self.turns = label, max(turns, 1)
        self.turn(0)

    def turn(self, index: int) -> None:
        share = min(index / self.turns, 1.0)
        description = f"{self.label} turn {index}/{self.turns}"
        self._bar.update(self._task, completed=self.done + share, description=description)
        self._bar.refresh()

    def finish(self, summary: str) -> None:
        self.done += 1
        self._bar.update(self._task, completed=self.done)
        line = f"[{self.done}/{self.total}] {self.label}: {summary}"
        self.console.print(line, markup=False, soft_wrap=True)
