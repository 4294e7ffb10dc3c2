"""The Codex-shaped scenario, client side (``rollout bench --scenario codex``).

What makes a Codex CLI request heavy, reproduced deterministically:

* ~15 KB of developer instructions and 12 tools with nested JSON schemas, resent on every
  request in the standard modes (the server must notice they did not change);
* tool outputs of 0.2-8 KB (file reads, build logs, diffs, search hits), generated here from
  a seeded schedule, so every mode receives byte-identical outputs;
* up to 60 calls (the server's ``bench-codex/N`` model cycles its calls, see
  ``engine/models/sim/bench_models.py``), so the history grows past 100k tokens.

Nothing is read from disk or the network: outputs are text built from fixed vocabularies.
"""

from __future__ import annotations

import asyncio
import random
import time
from types import TracebackType
from typing import Any, Self

from clients.bench.scenario import Call, ToolResult, scale_output

CODEX_PREFIX = "bench-codex/"
CODEX_CALLS = 60
CODEX_PROMPT = (
    "The engine's dispatcher sometimes runs queued jobs out of order under load. Find the cause, "
    "fix it with a minimal patch, and make sure the whole test suite passes."
)
# Output sizes in bytes, cycled by call index: mostly file reads and logs of several KB, with
# small status outputs between them (Codex sessions look like this: few tiny, many large).
_SIZES = (6200, 7800, 400, 5400, 8000, 240, 7000, 3600, 6800, 1200, 7600, 5000, 8000, 900)


def codex_model(calls: int) -> str:
    """The model name that makes a ``--bench-models`` server run the codex cycle."""
    return f"{CODEX_PREFIX}{calls}"


def _obj(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


def _s(text: str) -> dict[str, Any]:
    return {"type": "string", "description": text}


def _i(text: str, minimum: int = 0) -> dict[str, Any]:
    return {"type": "integer", "description": text, "minimum": minimum}


def _flag(text: str) -> dict[str, Any]:
    return {"type": "boolean", "description": text}


_RANGE = _obj({"start": _i("first line (1-based)", 1), "end": _i("last line", 1)}, ["start"])
_OPTS = _obj(
    {
        "context": _i("lines of context around each hit"),
        "hidden": _flag("include dotfiles"),
        "color": _flag("ANSI colors in the output"),
        "max_results": _i("stop after this many results", 1),
        "globs": {"type": "array", "items": _s("glob"), "description": "path filters"},
    },
    [],
)
_TOOL_SCHEMAS: dict[str, tuple[str, dict[str, Any]]] = {
    "shell": (
        "Runs a command in the sandbox and returns its stdout, stderr and exit code.",
        _obj(
            {
                "command": {"type": "array", "items": _s("argv element"), "minItems": 1},
                "workdir": _s("working directory, relative to the workspace root"),
                "timeout_ms": _i("kill the command after this many milliseconds", 1),
                "env": {"type": "object", "additionalProperties": _s("value")},
                "sandbox": _obj(
                    {
                        "network": {"type": "string", "enum": ["off", "on"]},
                        "writable_roots": {"type": "array", "items": _s("path")},
                    },
                    [],
                ),
            },
            ["command"],
        ),
    ),
    "apply_patch": (
        "Applies a patch in the apply_patch envelope format (Begin Patch / Update File / End).",
        _obj({"patch": _s("the whole patch text"), "dry_run": _flag("check only")}, ["patch"]),
    ),
    "read_file": (
        "Reads a text file, optionally a line range, with line numbers.",
        _obj({"path": _s("file path"), "range": _RANGE, "options": _OPTS}, ["path"]),
    ),
    "list_dir": (
        "Lists a directory tree to a given depth.",
        _obj({"path": _s("directory"), "depth": _i("levels", 1), "options": _OPTS}, ["path"]),
    ),
    "grep_files": (
        "Searches files for a regular expression; returns matching lines with context.",
        _obj(
            {
                "pattern": _s("regular expression"),
                "paths": {"type": "array", "items": _s("path")},
                "options": _OPTS,
            },
            ["pattern"],
        ),
    ),
    "update_plan": (
        "Records the agent's plan: steps with a status each.",
        _obj(
            {
                "explanation": _s("why the plan changed"),
                "plan": {
                    "type": "array",
                    "items": _obj(
                        {
                            "step": _s("what to do"),
                            "status": {
                                "type": "string",
                                "enum": ["pending", "in_progress", "completed"],
                            },
                        },
                        ["step", "status"],
                    ),
                },
            },
            ["plan"],
        ),
    ),
    "run_tests": (
        "Runs the test suite (or a filtered part) and returns a summary and failures.",
        _obj(
            {
                "target": _s("package or directory"),
                "filters": _obj({"name": _s("substring of test names"), "tags": _OPTS}, []),
                "jobs": _i("parallel jobs", 1),
            },
            ["target"],
        ),
    ),
    "git": (
        "Runs a read-only git subcommand (status, diff, log, show, blame).",
        _obj(
            {
                "subcommand": {
                    "type": "string",
                    "enum": ["status", "diff", "log", "show", "blame"],
                },
                "args": {"type": "array", "items": _s("argument")},
                "options": _OPTS,
            },
            ["subcommand"],
        ),
    ),
    "search_symbols": (
        "Finds symbol definitions by name in the workspace index.",
        _obj(
            {
                "query": _s("symbol name or prefix"),
                "kinds": {
                    "type": "array",
                    "items": {"type": "string", "enum": ["struct", "impl", "fn", "trait"]},
                },
                "limit": _i("maximum results", 1),
            },
            ["query"],
        ),
    ),
    "view_logs": (
        "Shows recent log lines of a process or test run, filtered.",
        _obj(
            {
                "source": _s("log source"),
                "filter": _obj(
                    {
                        "level": {"type": "string", "enum": ["debug", "info", "warn", "error"]},
                        "since_s": _i("only lines newer than this many seconds"),
                        "contains": _s("substring"),
                    },
                    [],
                ),
            },
            ["source"],
        ),
    ),
    "web_search": (
        "Searches the web and returns titles, links and snippets.",
        _obj({"query": _s("search terms"), "options": _OPTS}, ["query"]),
    ),
    "view_image": (
        "Attaches a local image file to the conversation for the model to look at.",
        _obj({"path": _s("image path")}, ["path"]),
    ),
}
TOOL_NAMES = tuple(_TOOL_SCHEMAS)


def tool_definitions() -> list[dict[str, Any]]:
    return [
        {"type": "function", "name": name, "description": text, "parameters": schema}
        for name, (text, schema) in _TOOL_SCHEMAS.items()
    ]


_RULES = (
    "Before you edit a file, read the parts you will change and the code that calls them.",
    "Prefer the smallest patch that fixes the root cause; do not reformat unrelated code.",
    "Run the narrowest relevant tests first, then the whole suite before you finish.",
    "Use apply_patch for every edit; never write files with shell redirection.",
    "Quote file paths relative to the workspace root, with line numbers when you cite code.",
    "When a command fails, read its output fully before trying a different command.",
    "Keep the plan current with update_plan when a step starts or finishes.",
    "Do not run commands that need the network unless the user asked for it.",
    "Summarise what changed and why at the end, in a few sentences, without code blocks.",
    "If a test is flaky, run it three times and report the pass rate instead of retrying.",
)
_SECTIONS = (
    "General", "Editing", "Testing", "Shell", "Planning", "Sandbox and approvals", "Git",
    "Output format", "Reviewing code", "Long tasks", "Safety", "Communication",
)  # fmt: skip


def instructions(target_bytes: int = 15_000) -> str:
    """~15 KB of developer instructions in sections, as a coding agent's system prompt is."""
    parts = ["You are a coding agent running in a terminal-based harness on the user's machine."]
    size, index = len(parts[0]), 0
    while size < target_bytes:
        section = _SECTIONS[index % len(_SECTIONS)]
        body = "\n".join(
            f"- {_RULES[(index + k) % len(_RULES)]} ({section.lower()} rule {index}.{k})"
            for k in range(5)
        )
        text = f"\n\n## {section} ({index + 1})\n{body}"
        parts.append(text)
        size += len(text)
        index += 1
    return "".join(parts)[:target_bytes]


_WORDS = (
    "queue", "dispatch", "worker", "task", "handle", "state", "poll", "ready", "wake", "slot",
    "batch", "drain", "guard", "lock", "epoch", "ticket", "budget", "permit", "shard", "tick",
)  # fmt: skip


def generated_output(name: str, index: int, size: int) -> str:
    """A deterministic tool output of ``size`` bytes that reads like ``name``'s output."""
    rng = random.Random(index * 7919 + len(name))
    lines: list[str] = [f"# {name} #{index}"]
    total = len(lines[0])
    n = 0
    while total < size:
        a, b, c = (rng.choice(_WORDS) for _ in range(3))
        n += 1
        if name in ("shell", "run_tests", "view_logs"):
            line = f"[{n:04d}] {a}::{b} {c}={rng.randint(0, 99999)} ok in {rng.random():.3f}s"
        elif name in ("grep_files", "search_symbols", "git"):
            line = f"src/{a}/{b}.rs:{rng.randint(1, 900)}:    let {c}_{n} = self.{a}.{b}({c});"
        else:
            line = f"{n:4d}  fn {a}_{b}(&mut self, {c}: usize) -> Result<{b.title()}, Error> {{"
        lines.append(line)
        total += len(line) + 1
    return "\n".join(lines)[:size]


class CodexTools:
    """Runs the codex calls on the client: outputs generated from the call index (so every
    mode gets the same bytes), timed like real tools and kept out of the overhead figures."""

    def __init__(self, history_scale: int = 1, tool_latency_s: float = 0.0) -> None:
        self.history_scale = max(1, history_scale)
        self.tool_latency_s = tool_latency_s
        self.calls = 0

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    def definitions(self) -> list[dict[str, Any]]:
        return tool_definitions()

    def first_request(self, model: str) -> dict[str, Any]:
        return {
            "model": model,
            "instructions": instructions(),
            "input": [{"type": "message", "role": "user", "content": CODEX_PROMPT}],
            "tools": tool_definitions(),
        }

    async def run(self, calls: list[Call]) -> list[ToolResult]:
        results = []
        for call in calls:
            start = time.perf_counter()
            size = _SIZES[self.calls % len(_SIZES)]
            output = generated_output(call.name, self.calls, size)
            self.calls += 1
            output = scale_output(output, self.history_scale)
            if self.tool_latency_s > 0:
                await asyncio.sleep(self.tool_latency_s)
            results.append(ToolResult(call.call_id, output, time.perf_counter() - start))
        return results
