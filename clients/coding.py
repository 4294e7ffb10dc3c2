"""Client side of the ``sim-coding-agent`` scenario: a sandbox project and the tools that act on it.

The server's scripted model (``engine/models/sim/scenarios.py``) lists, reads, searches, edits and
tests this project; these tools do the real work on real files, so a finished rollout leaves the
sandbox genuinely fixed. Everything is deterministic and in-process (``run_tests`` simulates a
pytest run instead of spawning one), so the scenario doubles as a benchmark and a test.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from clients import coding_files as files
from clients.testrun import simulate_run
from clients.toolbox import ToolError, ToolRegistry

MODULE_COUNT = 8
SCENARIO_TOOL_CALLS = 26  # the server's script length (SIM-4): progress, and the bench's loops
SCENARIO_PROMPT = (
    "The test suite of this project is failing. Find the bugs, fix them with minimal edits, "
    "and make sure all tests pass."
)
SCENARIO_INSTRUCTIONS = (
    "You are a careful coding agent working in a sandboxed repository. Explore before editing, "
    "make minimal exact-string edits, and re-run the tests after each batch of changes."
)
BUG_MARKER = re.compile(r"#\s*BUG-\d+")
MAX_READ_BYTES = 256 * 1024
MAX_SEARCH_MATCHES = 200
_SKIP_DIRS = {"__pycache__", ".git", ".pytest_cache"}
_TEST_FILE = re.compile(r"test_\w*\.py")

# ---------------------------------------------------------------------- the sandbox


def sandbox_files() -> dict[str, str]:
    """Relative path -> content of every sandbox file (pure, so determinism is testable)."""
    out = {"README.md": files.README, "src/calc/__init__.py": files.PACKAGE_INIT}
    for index, (title, about, use, topic) in enumerate(files.TOPICS):
        nn = f"{index:02d}"
        text = files.MODULE_TEMPLATE.replace("@@TOPIC@@", topic)
        for key, value in (("TITLE", title), ("ABOUT", about), ("USE", use), ("NN", nn)):
            text = text.replace(f"@@{key}@@", value)
        out[f"src/calc/module_{nn}.py"] = text
    out["tests/test_core.py"] = files.TEST_CORE
    out["tests/test_ops.py"] = _test_ops()
    return out


def _test_ops() -> str:
    imports = "\n".join(f"from calc.module_{i:02d} import op_{i:02d}" for i in range(MODULE_COUNT))
    cases = "".join(files.TEST_OPS_CASE.replace("@@NN@@", f"{i:02d}") for i in range(MODULE_COUNT))
    return files.TEST_OPS_HEADER.replace("@@IMPORTS@@", imports) + cases


def make_sandbox(root: Path) -> Path:
    """Write the project under ``root`` (created if needed) and return ``root``."""
    for relative, content in sandbox_files().items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8")
    return root


def remaining_bugs(root: Path) -> list[str]:
    """``path:line`` of every BUG marker still in the sandbox's sources."""
    found: list[str] = []
    for path in sorted((root / "src").rglob("*.py")):
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if BUG_MARKER.search(line):
                found.append(f"{path.relative_to(root).as_posix()}:{lineno}")
    return found


# ---------------------------------------------------------------------- the tools


class Sandbox:
    """The five scenario tools, confined to ``root`` (paths may not escape it)."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    def resolve(self, path: str) -> Path:
        target = (self.root / path).resolve()
        if not target.is_relative_to(self.root):
            raise ToolError(f"error: path '{path}' is outside the project")
        if not target.exists():
            raise ToolError(f"error: no such file or directory: {path}")
        return target

    def relative(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix() or "."

    def list_dir(self, path: str = ".") -> str:
        directory = self.resolve(path)
        if not directory.is_dir():
            raise ToolError(f"error: not a directory: {path}")
        lines = []
        for entry in sorted(directory.iterdir(), key=lambda p: p.name):
            if entry.name in _SKIP_DIRS:
                continue
            if entry.is_dir():
                lines.append(f"{entry.name}/")
            else:
                lines.append(f"{entry.name}  ({entry.stat().st_size:,} bytes)")
        return "\n".join(lines) if lines else "(empty directory)"

    def read_file(self, path: str) -> str:
        target = self.resolve(path)
        if target.is_dir():
            raise ToolError(f"error: {path} is a directory; use list_dir")
        data = target.read_bytes()
        text = data[:MAX_READ_BYTES].decode("utf-8", errors="replace")
        if len(data) > MAX_READ_BYTES:
            text += f"\n… (truncated: {len(data):,} bytes, showing {MAX_READ_BYTES:,})"
        return text

    def search(self, pattern: str, path: str = ".") -> str:
        """Like ``grep -rn``: ``path:line:text`` for every matching line, in path order."""
        try:
            regex = re.compile(pattern)
        except re.error as exc:
            raise ToolError(f"error: invalid regular expression {pattern!r}: {exc}") from None
        matches = [
            f"{self.relative(file)}:{lineno}:{line}"
            for file in self._files(self.resolve(path))
            for lineno, line in enumerate(_lines(file), 1)
            if regex.search(line)
        ]
        if not matches:
            return f"no matches for /{pattern}/"
        shown = matches[:MAX_SEARCH_MATCHES]
        if len(matches) > len(shown):
            shown.append(f"… {len(matches) - len(shown)} more matches not shown")
        return "\n".join(shown)

    def _files(self, start: Path) -> list[Path]:
        if start.is_file():
            return [start]
        return sorted(
            p
            for p in start.rglob("*")
            if p.is_file() and not _SKIP_DIRS.intersection(p.relative_to(start).parts)
        )

    def edit_file(self, path: str, old: str, new: str) -> str:
        """Exact string replacement of a unique occurrence (an agent edit must be unambiguous)."""
        target = self.resolve(path)
        text = target.read_text(encoding="utf-8")
        count = text.count(old) if old else 0
        if count == 0:
            raise ToolError(f"error: the text to replace was not found in {path}")
        if count > 1:
            raise ToolError(
                f"error: the text to replace occurs {count} times in {path}; "
                "include more surrounding context to make it unique"
            )
        at = text.index(old)
        target.write_text(text.replace(old, new, 1), encoding="utf-8")
        line = text.count("\n", 0, at) + 1
        return f"Edited {path}: replaced 1 occurrence at line {line}."

    def run_tests(self, target: str = "tests") -> str:
        """A simulated pytest run over ``target`` (``dir``, ``file`` or ``file::test``)."""
        where, _, only = target.partition("::")
        try:
            start = self.resolve(where or "tests")
        except ToolError:
            raise ToolError(
                f"ERROR: file or directory not found: {target}\n\nno tests ran in 0.00s"
            ) from None
        test_files = [p for p in self._files(start) if _TEST_FILE.fullmatch(p.name)]
        return simulate_run(self.root, test_files, only or None)


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        return []


@dataclass(frozen=True, slots=True)
class _Spec:
    description: str
    properties: dict[str, str]  # name -> description (all strings)
    required: tuple[str, ...]


_SPECS: dict[str, _Spec] = {
    "list_dir": _Spec(
        "List a directory of the project: subdirectories end with '/', files show their size.",
        {"path": "Directory relative to the project root, e.g. '.' or 'src/calc'."},
        ("path",),
    ),
    "read_file": _Spec(
        "Read a text file of the project.",
        {"path": "File path relative to the project root."},
        ("path",),
    ),
    "search": _Spec(
        "Search file contents with a Python regular expression, like grep -rn: "
        "prints path:line:text for each matching line.",
        {
            "pattern": "Regular expression to search for.",
            "path": "Directory or file to search (default: the whole project).",
        },
        ("pattern",),
    ),
    "edit_file": _Spec(
        "Replace one exact, unique occurrence of `old` with `new` in a file.",
        {
            "path": "File path relative to the project root.",
            "old": "The exact text to replace; it must occur exactly once.",
            "new": "The replacement text.",
        },
        ("path", "old", "new"),
    ),
    "run_tests": _Spec(
        "Run the test suite (or part of it) and show pytest-style results.",
        {"target": "Test directory, file, or file::test_name (default: 'tests')."},
        (),
    ),
}


def coding_tools(root: Path) -> ToolRegistry:
    """The scenario's tools bound to the sandbox at ``root``."""
    sandbox = Sandbox(root)
    registry = ToolRegistry()
    for name, spec in _SPECS.items():
        parameters = {
            "type": "object",
            "properties": {
                key: {"type": "string", "description": text}
                for key, text in spec.properties.items()
            },
            "required": list(spec.required),
            "additionalProperties": False,
        }
        registry.register(name, getattr(sandbox, name), spec.description, parameters)
    return registry
