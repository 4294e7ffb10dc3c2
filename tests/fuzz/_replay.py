"""Replay a state-machine run exactly as hypothesis printed it (not collected by pytest).

When a stateful fuzzer fails, hypothesis prints the failing run: ``state.rule(...)`` lines, each
preceded by the values the rule drew from ``data`` (``Draw N (label): value``). ``replay`` runs
that text again against a machine instance: each rule is called with the printed arguments and
a ``ScriptedData`` that hands back the printed draws in order. So a finding can be pasted
verbatim into a regression test, and the run no longer depends on hypothesis' seed or database.

Only the rules' own draws are replayed; what the server does (its timing, its ids) happens
live, as in the fuzz run.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from typing import Any

_DRAW = re.compile(r"^Draw \d+(?: \([^)]*\))?: (?P<value>.*)$", re.DOTALL)
_STEP = re.compile(r"^state\.(?P<rule>\w+)\((?P<args>.*)\)$")


class ScriptedData:
    """Stands in for ``st.data()``: each ``draw`` returns the next printed value (the strategy
    is not consulted), and a rule that draws more or less than was printed is an error."""

    def __init__(self, values: list[Any], where: str) -> None:
        self._values = list(values)
        self._where = where

    def draw(self, strategy: Any, label: str | None = None) -> Any:
        assert self._values, f"{self._where}: drew more values than the printed run had"
        return self._values.pop(0)

    def check_consumed(self) -> None:
        assert not self._values, f"{self._where}: {len(self._values)} printed draws unused"


def steps(printed: str) -> Iterator[tuple[str, dict[str, Any], list[Any]]]:
    """(rule name, keyword arguments, draws) for each ``state.rule(...)`` line of ``printed``.
    ``state = …``, ``state.teardown()`` and the ``Explanation`` that follows are skipped."""
    draws: list[Any] = []
    for line in _logical_lines(printed):
        if line.startswith("Explanation:"):
            return
        draw = _DRAW.match(line)
        if draw is not None:
            draws.append(ast.literal_eval(draw["value"]))
            continue
        step = _STEP.match(line)
        if step is None or step["rule"] == "teardown":
            continue
        yield step["rule"], _arguments(line), draws
        draws = []


def replay(machine: Any, printed: str) -> None:
    """Run the printed steps on ``machine`` (a RuleBasedStateMachine instance), then its
    teardown, as hypothesis would."""
    try:
        for number, (rule, kwargs, draws) in enumerate(steps(printed), 1):
            data = ScriptedData(draws, f"step {number} ({rule})")
            if "data" in kwargs:
                kwargs["data"] = data
            getattr(machine, rule)(**kwargs)
            data.check_consumed()
    finally:
        machine.teardown()


def _arguments(line: str) -> dict[str, Any]:
    call = ast.parse(line, mode="eval").body
    assert isinstance(call, ast.Call), line
    kwargs: dict[str, Any] = {}
    for keyword in call.keywords:
        assert keyword.arg is not None, line
        if keyword.arg == "data":  # printed as data(...): the draws stand in for it
            kwargs["data"] = None
        else:
            kwargs[keyword.arg] = ast.literal_eval(keyword.value)
    return kwargs


def _logical_lines(printed: str) -> Iterator[str]:
    """Lines of the printed run, with a value that hypothesis wrapped over several lines
    joined back into one (a continuation line starts with neither ``Draw`` nor ``state``)."""
    current: str | None = None
    for raw in printed.strip().splitlines():
        line = raw.strip()
        if not line:
            continue
        starts = line.startswith(("Draw ", "state", "Explanation:"))
        if starts or current is None:
            if current is not None:
                yield current
            current = line
        else:
            current += "\n" + line
    if current is not None:
        yield current
