"""The coding sandbox and its tools, without a server: shape, determinism, tool behaviour."""

from __future__ import annotations

import inspect
import re
import runpy
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from clients.coding import coding_tools, make_sandbox, remaining_bugs, sandbox_files
from engine.models.sim.scenarios import CODING_AGENT_STEPS, CODING_AGENT_TOOLS, MODULES, TESTS

MARKER_LINE = re.compile(r"^    return a - b  # BUG-(\d\d)$", re.MULTILINE)


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_sandbox_has_the_scenario_layout_and_is_deterministic(tmp_path: Path) -> None:
    first = tree(make_sandbox(tmp_path / "a"))
    second = tree(make_sandbox(tmp_path / "b"))
    assert first == second
    assert {"README.md", *MODULES, *TESTS} <= set(first)
    assert sandbox_files() == {k: v.decode() for k, v in first.items()}


@pytest.mark.parametrize("index", range(8))
def test_each_module_is_realistic_with_one_marked_bug(index: int) -> None:
    text = sandbox_files()[MODULES[index]]
    assert 2_000 <= len(text.encode()) <= 8_000
    compile(text, MODULES[index], "exec")
    assert MARKER_LINE.findall(text) == [f"{index:02d}"]
    function = text[text.index(f"\ndef op_{index:02d}(a, b):\n") :]
    body = function.split("\n\n\n", 1)[0]
    assert f"return a - b  # BUG-{index:02d}" in body


def test_test_files_are_realistic() -> None:
    files = sandbox_files()
    for path in TESTS:
        assert len(files[path].encode()) >= 1_000
        compile(files[path], path, "exec")


def test_schemas_accept_every_scripted_call(sandbox: Path) -> None:
    registry = coding_tools(sandbox)
    assert set(registry.names) == set(CODING_AGENT_TOOLS)
    for step in CODING_AGENT_STEPS:
        tool = registry.get(step.name)
        assert tool is not None
        schema = tool.parameters
        assert set(step.arguments) <= set(schema["properties"])
        assert set(schema["required"]) <= set(step.arguments)


async def test_replaying_the_script_fixes_the_sandbox(sandbox: Path) -> None:
    registry = coding_tools(sandbox)
    outputs = []
    for step in CODING_AGENT_STEPS:
        outcome = await registry.execute(step.name, step.arguments_json())
        assert outcome.ok, outcome.output
        outputs.append(outcome.output)
    assert "8 failed, 11 passed" in outputs[2]
    assert "4 failed, 15 passed" in outputs[19]
    assert "19 passed" in outputs[-1] and "failed" not in outputs[-1]
    assert outputs[-2] == "no matches for /BUG-/"
    assert remaining_bugs(sandbox) == []


# ---------------------------------------------------------------------- real execution agrees


@pytest.fixture
def run_real_tests(
    sandbox: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[], set[str]]]:
    """Runs the sandbox's test functions in-process (no subprocess); returns the failures."""
    monkeypatch.syspath_prepend(str(sandbox / "src"))

    def run() -> set[str]:
        for name in [m for m in sys.modules if m == "calc" or m.startswith("calc.")]:
            del sys.modules[name]
        failed: set[str] = set()
        for path in TESTS:
            namespace: dict[str, Any] = runpy.run_path(str(sandbox / path))
            for name, fn in namespace.items():
                if name.startswith("test_") and inspect.isfunction(fn):
                    try:
                        fn()
                    except AssertionError:
                        failed.add(name)
        return failed

    yield run
    for name in [m for m in sys.modules if m == "calc" or m.startswith("calc.")]:
        del sys.modules[name]


def simulated_failures(output: str) -> set[str]:
    return set(re.findall(r"^FAILED \S+::(\w+)", output, re.MULTILINE))


async def test_simulated_run_matches_real_execution(
    sandbox: Path, run_real_tests: Callable[[], set[str]]
) -> None:
    registry = coding_tools(sandbox)
    for fixed in range(0, 9, 3):
        for index in range(fixed):
            path = sandbox / MODULES[index]
            path.write_text(path.read_text().replace("a - b  # BUG", "a + b  # fixed"))
        simulated = await registry.execute("run_tests", '{"target": "tests"}')
        assert simulated_failures(simulated.output) == run_real_tests()
        assert len(simulated_failures(simulated.output)) == max(8 - fixed, 0)


# ---------------------------------------------------------------------- individual tools


async def call(root: Path, name: str, **arguments: str) -> tuple[str, bool]:
    outcome = await coding_tools(root).execute(name, arguments)
    return outcome.output, outcome.ok


async def test_list_dir(sandbox: Path) -> None:
    output, ok = await call(sandbox, "list_dir", path=".")
    assert ok and output.splitlines() == ["README.md  (1,292 bytes)", "src/", "tests/"]
    assert (await call(sandbox, "list_dir", path="README.md"))[1] is False


async def test_read_file_and_sandbox_escape(sandbox: Path) -> None:
    output, ok = await call(sandbox, "read_file", path="src/calc/module_03.py")
    assert ok and output == (sandbox / "src/calc/module_03.py").read_text()
    for path in ("../outside.txt", "/etc/passwd", "src/../../x"):
        output, ok = await call(sandbox, "read_file", path=path)
        assert not ok and "outside the project" in output
    output, ok = await call(sandbox, "read_file", path="nope.py")
    assert not ok and "no such file" in output


async def test_search_is_grep_like(sandbox: Path) -> None:
    output, ok = await call(sandbox, "search", pattern=r"BUG-0[12]")
    assert ok
    assert output.splitlines() == [
        f"src/calc/module_0{i}.py:{line}:    return a - b  # BUG-0{i}"
        for i, line in ((1, _marker_line(sandbox, 1)), (2, _marker_line(sandbox, 2)))
    ]
    assert (await call(sandbox, "search", pattern="zzz_nothing")) == (
        "no matches for /zzz_nothing/",
        True,
    )
    output, ok = await call(sandbox, "search", pattern="(")
    assert not ok and "invalid regular expression" in output
    output, ok = await call(sandbox, "search", pattern="^def test_op", path="tests/test_ops.py")
    assert ok and len(output.splitlines()) == 8


def _marker_line(root: Path, index: int) -> int:
    lines = (root / MODULES[index]).read_text().splitlines()
    return next(n for n, line in enumerate(lines, 1) if f"BUG-{index:02d}" in line)


async def test_edit_file_exact_unique_replacement(sandbox: Path) -> None:
    path = MODULES[4]
    before = (sandbox / path).read_text()
    output, ok = await call(sandbox, "edit_file", path=path, old="    return", new="    yield")
    assert not ok and "occurs" in output and "unique" in output
    output, ok = await call(sandbox, "edit_file", path=path, old="return a * b", new="x")
    assert not ok and "not found" in output
    assert (sandbox / path).read_text() == before
    output, ok = await call(
        sandbox, "edit_file", path=path, old="return a - b  # BUG-04", new="return a + b"
    )
    assert ok and output == f"Edited {path}: replaced 1 occurrence at line {_line(before)}."
    assert (sandbox / path).read_text() == before.replace("return a - b  # BUG-04", "return a + b")


def _line(text: str) -> int:
    return text[: text.index("# BUG-")].count("\n") + 1


async def test_run_tests_targets(sandbox: Path) -> None:
    output, ok = await call(sandbox, "run_tests", target="tests/test_core.py")
    assert ok and "11 passed" in output and "collected 11 items" in output
    output, ok = await call(sandbox, "run_tests", target="tests/test_ops.py::test_op_05")
    assert ok and "1 failed" in output and "FAILED tests/test_ops.py::test_op_05" in output
    output, ok = await call(sandbox, "run_tests", target="tests/missing.py")
    assert not ok and output.startswith("ERROR: file or directory not found")
    output, ok = await call(sandbox, "run_tests")
    assert ok and "collected 19 items" in output
