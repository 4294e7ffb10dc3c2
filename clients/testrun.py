"""A deterministic, in-process stand-in for ``pytest`` over the coding sandbox.

Why simulate: the scenario must be reproducible and cheap (no subprocess, no interpreter state),
yet its output must look like the real thing so the transcript reads like a real agent run. The
rule is simple and documented: ``test_op_NN`` fails while ``op_NN`` in ``src/calc/module_NN.py``
still holds a ``# BUG-`` marker; every other test passes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

WIDTH = 80
_TEST_DEF = re.compile(r"^def (test_\w+)\(", re.MULTILINE)
_OP_TEST = re.compile(r"test_op_(\d+)")
_BUG = re.compile(r"#\s*BUG-\d+")


@dataclass(frozen=True, slots=True)
class Outcome:
    file: str  # relative to the project root
    name: str
    line: int  # line of the test's first statement
    error: str | None  # the assertion message, None when the test passed
    detail: tuple[str, ...] = ()


def simulate_run(root: Path, test_files: list[Path], only: str | None = None) -> str:
    """The pytest-style report for the tests defined in ``test_files``."""
    outcomes = [
        outcome
        for file in test_files
        for outcome in _collect(root, file)
        if only is None or outcome.name == only
    ]
    return "\n".join(_report(outcomes))


def _collect(root: Path, file: Path) -> list[Outcome]:
    text = file.read_text(encoding="utf-8")
    relative = file.relative_to(root).as_posix()
    outcomes = []
    for match in _TEST_DEF.finditer(text):
        line = text.count("\n", 0, match.start()) + 2
        outcomes.append(_judge(root, relative, match.group(1), line))
    return outcomes


def _judge(root: Path, file: str, name: str, line: int) -> Outcome:
    op = _OP_TEST.fullmatch(name)
    if op is None:
        return Outcome(file, name, line, None)
    nn = op.group(1)
    module = root / "src" / "calc" / f"module_{nn}.py"
    if not module.is_file():
        error = f"ModuleNotFoundError: No module named 'calc.module_{nn}'"
        return Outcome(file, name, line, error)
    if not _has_marker(module.read_text(encoding="utf-8"), f"op_{nn}"):
        return Outcome(file, name, line, None)
    detail = (
        f">       assert op_{nn}(2, 3) == 5",
        "E       assert -1 == 5",
        f"E        +  where -1 = op_{nn}(2, 3)",
    )
    return Outcome(file, name, line, "assert -1 == 5", detail)


def _has_marker(source: str, function: str) -> bool:
    """Whether the body of top-level ``def function(`` contains a BUG marker."""
    inside = False
    for line in source.splitlines():
        if line.startswith(f"def {function}("):
            inside = True
        elif inside and line and not line[0].isspace():
            return False
        elif inside and _BUG.search(line):
            return True
    return False


# ---------------------------------------------------------------------- rendering


def _rule(title: str, char: str = "=") -> str:
    return f" {title} ".center(WIDTH, char)


def _report(outcomes: list[Outcome]) -> list[str]:
    lines = [
        _rule("test session starts"),
        "platform sandbox -- Python 3.11, pytest-8.3 (simulated run)",
        "rootdir: .",
        f"collected {len(outcomes)} item{'' if len(outcomes) == 1 else 's'}",
        "",
    ]
    lines += _progress(outcomes)
    failures = [o for o in outcomes if o.error is not None]
    if failures:
        lines += ["", _rule("FAILURES")]
        for outcome in failures:
            lines += _failure(outcome)
        lines.append(_rule("short test summary info"))
        lines += [f"FAILED {o.file}::{o.name} - {o.error}" for o in failures]
    else:
        lines.append("")
    lines.append(_summary(len(failures), len(outcomes) - len(failures)))
    return lines


def _progress(outcomes: list[Outcome]) -> list[str]:
    lines: list[str] = []
    done = 0
    for file in dict.fromkeys(o.file for o in outcomes):
        marks = "".join("." if o.error is None else "F" for o in outcomes if o.file == file)
        done += len(marks)
        percent = f"[{100 * done // len(outcomes):3d}%]"
        lines.append(f"{file} {marks}".ljust(WIDTH - len(percent)) + percent)
    return lines


def _failure(outcome: Outcome) -> list[str]:
    return [
        _rule(outcome.name, "_"),
        "",
        f"    def {outcome.name}():",
        *(outcome.detail or (f"E       {outcome.error}",)),
        "",
        f"{outcome.file}:{outcome.line}: AssertionError",
    ]


def _summary(failed: int, passed: int) -> str:
    if not failed and not passed:
        return _rule("no tests ran in 0.00s")
    seconds = 0.02 + 0.003 * (failed + passed)  # deterministic, plausible
    parts = [f"{failed} failed"] if failed else []
    parts += [f"{passed} passed"] if passed else []
    return _rule(f"{', '.join(parts)} in {seconds:.2f}s")
