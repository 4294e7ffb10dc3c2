"""``rollout agent``: run the coding-agent scenario against a server and show what happens.

The demo is the quickest end-to-end check of a deployment: it builds a throwaway sandbox, lets
the (simulated) model fix it through real tool calls over the chosen transport, and prints a
progress display and a summary. Exit status 0 means the rollout completed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Self

from rich.console import Console
from rich.progress import BarColumn, TextColumn
from rich.progress import Progress as Bar
from rich.table import Column

from clients.coding import (
    SCENARIO_INSTRUCTIONS,
    SCENARIO_PROMPT,
    SCENARIO_TOOL_CALLS,
    coding_tools,
    make_sandbox,
    remaining_bugs,
)
from clients.exceptions import ClientError
from clients.http import HttpClient
from clients.loop import Hooks, RolloutClient, RolloutResult, ToolCallRecord, TurnEnd
from clients.ws_append import AppendClient
from clients.ws_compat import CompatClient
from protocol.items import FunctionCall

MODES = ("append", "ws", "http")
BAR_WIDTH = 24
STATUS = "turn {task.fields[turn]:>2} · calls {task.completed:>2.0f} · {task.description}"


def make_client(
    mode: str, url: str, hooks: Hooks, headers: dict[str, str] | None = None
) -> RolloutClient:
    if mode == "append":
        return AppendClient(url, hooks=hooks, headers=headers)
    if mode == "ws":
        return CompatClient(url, hooks=hooks, headers=headers)
    if mode == "http":
        return HttpClient(url, hooks=hooks, headers=headers)
    raise ValueError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")


def summarize_arguments(arguments: str, width: int = 48) -> str:
    """``{"path": "a.py", "old": "..."}`` -> ``path=a.py old=...`` (each value shortened)."""
    try:
        decoded = json.loads(arguments)
    except json.JSONDecodeError:
        decoded = None
    if not isinstance(decoded, dict):
        return _shorten(arguments, width)
    return " ".join(f"{k}={_shorten(str(v), width)}" for k, v in decoded.items())


def _shorten(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


class Progress:
    """Live display (``rich``): a redrawn bar and the current call on a terminal, one plain line
    per tool call otherwise (a log or a pipe gets no control codes)."""

    def __init__(self, console: Console, *, quiet: bool) -> None:
        self.console = console
        self.quiet = quiet
        self.turns = 0
        self.calls = 0
        self._bar = Bar(
            BarColumn(bar_width=BAR_WIDTH),
            TextColumn(
                STATUS, markup=False, table_column=Column(no_wrap=True, overflow="ellipsis")
            ),
            console=console,
            auto_refresh=False,  # redrawn on each call, from the client's own task
            transient=True,  # the summary replaces it
            disable=quiet or not console.is_terminal,
        )
        self._task = self._bar.add_task("", total=SCENARIO_TOOL_CALLS, turn=1)

    def __enter__(self) -> Self:
        self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.stop()

    def hooks(self) -> Hooks:
        return Hooks(
            on_tool_call=self.tool_call, on_tool_result=self.tool_result, on_turn=self.turn
        )

    def turn(self, end: TurnEnd) -> None:
        self.turns += 1

    def tool_call(self, call: FunctionCall) -> None:
        status = f"{call.name} {summarize_arguments(call.arguments, 40)}"
        self._bar.update(self._task, description=status, turn=self.turns + 1)
        self._bar.refresh()

    def tool_result(self, record: ToolCallRecord) -> None:
        self.calls += 1
        self._bar.update(self._task, completed=min(self.calls, SCENARIO_TOOL_CALLS))
        if self.quiet or self.console.is_terminal:
            return
        mark = "" if record.ok else "  [tool error]"
        size = len(record.output.encode())
        args = summarize_arguments(record.arguments)
        self.console.print(f"  {self.calls:>3}. {record.name} {args} -> {size:,} B{mark}")


def print_summary(
    out: Console, result: RolloutResult, elapsed: float, bugs: list[str], *, quiet: bool
) -> None:
    usage = result.usage
    cached = usage.input_tokens_details.cached_tokens
    if quiet:
        out.print(
            f"completed: {result.turns} turns, {len(result.tool_calls)} tool calls, "
            f"{usage.total_tokens:,} tokens, {elapsed:.2f}s"
        )
        return
    failed = sum(1 for r in result.tool_calls if not r.ok)
    lines = [
        "",
        f"final answer: {result.final_text}",
        "",
        f"turns:       {result.turns} ({len(result.response_ids)} response(s), "
        f"{result.events:,} events)",
        f"tool calls:  {len(result.tool_calls)} ({failed} returned errors)",
        f"usage:       input {usage.input_tokens:,} (cached {cached:,}), "
        f"output {usage.output_tokens:,}, total {usage.total_tokens:,} tokens",
        f"elapsed:     {elapsed:.2f}s",
        f"sandbox:     {'all BUG markers fixed' if not bugs else f'{len(bugs)} BUG markers left'}",
    ]
    out.print("\n".join(lines))


async def run_demo(
    url: str,
    mode: str = "append",
    model: str = "sim-coding-agent",
    quiet: bool = False,
    api_key: str | None = None,
) -> int:
    """Run the scenario once; 0 when the rollout completed, 1 on any client-side failure."""
    out = Console(file=sys.stdout, highlight=False, markup=False, soft_wrap=True)
    progress = Progress(out, quiet=quiet)
    try:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        client = make_client(mode, url, progress.hooks(), headers)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if not quiet:
        out.print(f"coding agent · mode {mode} · model {model} · {url}")
    with tempfile.TemporaryDirectory(prefix="rollout-agent-") as tmp:
        root = make_sandbox(Path(tmp))
        start = time.perf_counter()
        try:
            with progress:
                result = await client.run(
                    model, SCENARIO_PROMPT, coding_tools(root), SCENARIO_INSTRUCTIONS
                )
        except ClientError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        finally:
            await client.close()
        print_summary(out, result, time.perf_counter() - start, remaining_bugs(root), quiet=quiet)
    return 0


def add_agent_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("agent", help="run the demo coding agent against a server")
    p.add_argument("--url", default="http://127.0.0.1:8000/v1")
    p.add_argument("--mode", choices=MODES, default="append", help="client transport")
    p.add_argument("--model", default="sim-coding-agent")
    p.add_argument(
        "--api-key-env",
        default="OPENAI_API_KEY",
        help="env var with the key, if the server wants one",
    )
    p.add_argument("--quiet", action="store_true")


def run_agent(args: argparse.Namespace) -> int:
    """``rollout agent``: the flags of ``add_agent_parser``, run to an exit status."""
    key = os.environ.get(args.api_key_env) if args.api_key_env else None
    return asyncio.run(
        run_demo(args.url, mode=args.mode, model=args.model, quiet=args.quiet, api_key=key)
    )
