"""``make mutants``: does each rule's test fail when the rule breaks? (a developer tool, not part
of ``make test``).

``tools/mutants.toml`` lists named mutations: the smallest plausible break of one rule (a file,
an exact text in it, what replaces it), the rule's ID and the pytest node ids that cite the rule.
Each mutation is applied, one at a time, to a scratch copy of the checkout (the working tree is
never written, so an interrupt cannot leave it mutated), and the cited tests run there
(``PYTHONPATH`` points every process they start, nodes and balancers' backends included, at the
copy). A test run that fails kills the mutation; one that passes means the mutation survived.
Exit status 1 if any survived (or a mutation no longer applies), else 0. A mutation whose tests
need a binary (``needs``: environment variables naming it, such as ``ROLLOUT_LLAMA_SERVER``) is
reported "NOT RUN" when it is missing, and listed as such at the end.

    .venv/bin/python tools/mutants.py                  # every mutation
    .venv/bin/python tools/mutants.py CLUSTER-12 MEM   # names or rule IDs starting so
    .venv/bin/python tools/mutants.py --list           # the list, nothing run
    .venv/bin/python tools/mutants.py --baseline MEM   # the cited tests unmutated first
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LIST = ROOT / "tools" / "mutants.toml"
# Not copied: environments, caches, build outputs (the scratch copy runs with this .venv).
SKIP = shutil.ignore_patterns(
    ".git", ".venv", ".tools", ".llama-server", "__pycache__", "*.egg-info", ".mypy_cache",
    ".pytest_cache", ".ruff_cache", ".hypothesis", "build", "data", "artifacts", "*.png",
    "*.jsonl",
)  # fmt: skip


@dataclass(frozen=True)
class Mutation:
    name: str
    rule: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]
    needs: tuple[str, ...] = ()  # environment variables naming files the tests need

    def missing(self) -> list[str]:
        """What this environment lacks to run the cited tests (nothing: they can run)."""
        return [n for n in self.needs if not Path(os.environ.get(n) or "/nonexistent").is_file()]

    def selected(self, patterns: list[str]) -> bool:
        return not patterns or any(
            self.name.startswith(p) or self.rule.startswith(p) for p in patterns
        )


def load(path: Path) -> list[Mutation]:
    data = tomllib.loads(path.read_text())
    out = [_mutation(m) for m in data["mutation"]]
    names = [m.name for m in out]
    duplicate = {n for n in names if names.count(n) > 1}
    if duplicate:
        raise SystemExit(f"{path}: duplicate names {sorted(duplicate)}")
    return out


def _mutation(m: dict[str, Any]) -> Mutation:
    tests, needs = tuple(m["tests"]), tuple(m.get("needs", ()))
    return Mutation(m["name"], m["rule"], m["file"], m["old"], m["new"], tests, needs)


def check(mutation: Mutation, root: Path) -> str | None:
    """Why the mutation cannot apply (None: it applies exactly once)."""
    target = root / mutation.file
    if not target.is_file():
        return f"no file {mutation.file}"
    count = target.read_text().count(mutation.old)
    if count != 1:
        return f"its old text occurs {count} times in {mutation.file} (must be exactly once)"
    if not mutation.tests:
        return "no tests cited"
    return None


def run_tests(scratch: Path, tests: tuple[str, ...], timeout: float) -> int:
    """The cited tests in the scratch copy: pytest's exit status (-1: over ``timeout``)."""
    env = {**os.environ, "PYTHONPATH": str(scratch), "PYTHONDONTWRITEBYTECODE": "1"}
    env["ROLLOUT_SOURCE_REPO"] = str(ROOT)  # the copy has no .git: the previous release's tree
    command = [
        sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-rfE",
        *tests,
    ]  # fmt: skip
    proc = subprocess.Popen(
        command, cwd=scratch, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=timeout)
    except BaseException:  # a timeout or Ctrl-C: the whole process group goes
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if sys.exc_info()[0] is subprocess.TimeoutExpired:
            return -1
        raise
    lines = out.decode(errors="replace").splitlines()
    # what failed and why: the short summary's lines and the first assertion's
    shown = [line for line in lines if line.startswith(("FAILED ", "ERROR "))][:3]
    shown += [line for line in lines if line.startswith("E ")][:1]
    for line in shown:
        print(f"    {line[:160]}", flush=True)
    return proc.returncode


def verdict(status: int) -> str:
    # pytest: 0 passed, 1 some failed, 2 interrupted (a collection error too), 3 internal
    # error, 4 usage error (no such node id), 5 nothing collected.
    return {0: "SURVIVED", 1: "killed", 2: "killed (error)", 3: "killed (error)"}.get(
        status, "timeout" if status == -1 else f"ERROR (pytest exit {status})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("only", nargs="*", help="mutation names or rule IDs (prefixes)")
    parser.add_argument("--list", action="store_true", help="print the mutations, run nothing")
    parser.add_argument("--baseline", action="store_true", help="run each one's tests unmutated")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per test run")
    parser.add_argument("--file", type=Path, default=LIST, help="the mutation list")
    args = parser.parse_args()
    mutations = [m for m in load(args.file) if m.selected(args.only)]
    if not mutations:
        raise SystemExit(f"no mutation matches {args.only}")
    if args.list:
        for m in mutations:
            print(f"{m.name:40} {m.rule:12} {m.file}  ({len(m.tests)} tests)")
        return 0
    results: list[tuple[Mutation, str]] = []
    with tempfile.TemporaryDirectory(prefix="mutants-") as tmp:
        scratch = Path(tmp) / "tree"
        shutil.copytree(ROOT, scratch, ignore=SKIP, symlinks=True)
        if (ROOT / ".tools").is_dir():  # the pinned Codex, MCP servers, NeMo Gym: read only
            (scratch / ".tools").symlink_to(ROOT / ".tools")
        for i, m in enumerate(mutations, 1):
            print(f"[{i}/{len(mutations)}] {m.name} ({m.rule}): {m.file}", flush=True)
            results.append((m, run_one(m, scratch, args.baseline, args.timeout)))
    return report(results)


def run_one(m: Mutation, scratch: Path, baseline: bool, timeout: float) -> str:
    """Apply ``m`` to the scratch copy, run its cited tests, put the file back: the verdict."""
    problem = check(m, scratch)
    if problem is not None:
        print(f"    cannot apply: {problem}")
        return "NOT APPLIED"
    if m.missing():
        print(f"    not run: set {', '.join(m.missing())} to the file it names")
        return "NOT RUN"
    if baseline and run_tests(scratch, m.tests, timeout) != 0:
        print("    the cited tests fail unmutated: no verdict")
        return "BASELINE FAILS"
    target = scratch / m.file
    original = target.read_text()
    target.write_text(original.replace(m.old, m.new, 1))
    started = time.monotonic()
    try:
        status = run_tests(scratch, m.tests, timeout)
    finally:
        target.write_text(original)
    print(f"    {verdict(status)} ({time.monotonic() - started:.0f} s)", flush=True)
    return verdict(status)


def report(results: list[tuple[Mutation, str]]) -> int:
    """The table of verdicts and the last line; 1 if any mutation was not killed."""
    print("\nmutation                                 rule         verdict")
    for m, outcome in results:
        print(f"{m.name:40} {m.rule:12} {outcome}")
    bad = [m.name for m, outcome in results if outcome not in ("killed", "killed (error)")]
    unrun = [m.name for m, outcome in results if outcome == "NOT RUN"]
    bad = [name for name in bad if name not in unrun]
    killed = len(results) - len(bad) - len(unrun)
    if unrun:  # not a survivor, but not checked either: say so on every run
        print(f"\nnot run here (a binary they need is missing): {', '.join(unrun)}")
    survivors = f"; not killed: {', '.join(bad)}" if bad else ""
    print(f"\n{killed} of {len(results) - len(unrun)} run killed{survivors}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
