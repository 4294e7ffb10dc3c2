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
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TextIO

from clients.coding import (
    SCENARIO_INSTRUCTIONS,
    SCENARIO_PROMPT,
    SCENARIO_TOOL_CALLS,
    coding_tools,
    make_sandbox,
    remaining_bugs,
)
from clients.errors import ClientError
from clients.http import HttpClient
from clients.loop import Hooks, RolloutClient, RolloutResult, ToolCallRecord, TurnEnd
from clients.ws_append import AppendClient
from clients.ws_compat import CompatClient
from protocol.items import FunctionCall

MODES = ("append", "ws", "http")
BAR_WIDTH = 24


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
    """Live display: one rewritten line on a terminal, one plain line per tool call otherwise."""

    def __init__(self, out: TextIO, *, tty: bool, quiet: bool) -> None:
        self.out = out
        self.tty = tty
        self.quiet = quiet
        self.turns = 0
        self.calls = 0

    def hooks(self) -> Hooks:
        return Hooks(
            on_tool_call=self.tool_call, on_tool_result=self.tool_result, on_turn=self.turn
        )

    def turn(self, end: TurnEnd) -> None:
        self.turns += 1

    def tool_call(self, call: FunctionCall) -> None:
        if self.tty and not self.quiet:
            self._status(f"{call.name} {summarize_arguments(call.arguments, 40)}")

    def tool_result(self, record: ToolCallRecord) -> None:
        self.calls += 1
        if self.quiet or self.tty:
            return
        mark = "" if record.ok else "  [tool error]"
        size = len(record.output.encode())
        args = summarize_arguments(record.arguments)
        print(f"  {self.calls:>3}. {record.name} {args} -> {size:,} B{mark}", file=self.out)

    def _status(self, text: str) -> None:
        done = min(self.calls, SCENARIO_TOOL_CALLS)
        filled = BAR_WIDTH * done // SCENARIO_TOOL_CALLS
        bar = "#" * filled + "." * (BAR_WIDTH - filled)
        line = f"[{bar}] turn {self.turns + 1:>2} · calls {self.calls:>2} · {text}"
        width = shutil.get_terminal_size((100, 24)).columns - 1  # never wrap: \r must suffice
        self.out.write("\r\x1b[2K" + line[:width])
        self.out.flush()

    def end_line(self) -> None:
        if self.tty and not self.quiet:
            self.out.write("\r\x1b[2K")
            self.out.flush()


def print_summary(
    out: TextIO, result: RolloutResult, elapsed: float, bugs: list[str], *, quiet: bool
) -> None:
    usage = result.usage
    cached = usage.input_tokens_details.cached_tokens
    if quiet:
        print(
            f"completed: {result.turns} turns, {len(result.tool_calls)} tool calls, "
            f"{usage.total_tokens:,} tokens, {elapsed:.2f}s",
            file=out,
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
    print("\n".join(lines), file=out)


async def run_demo(
    url: str,
    mode: str = "append",
    model: str = "sim-coding-agent",
    quiet: bool = False,
    api_key: str | None = None,
) -> int:
    """Run the scenario once; 0 when the rollout completed, 1 on any client-side failure."""
    out = sys.stdout
    progress = Progress(out, tty=out.isatty(), quiet=quiet)
    try:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        client = make_client(mode, url, progress.hooks(), headers)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if not quiet:
        print(f"coding agent · mode {mode} · model {model} · {url}", file=out)
    with tempfile.TemporaryDirectory(prefix="rollout-agent-") as tmp:
        root = make_sandbox(Path(tmp))
        start = time.perf_counter()
        try:
            result = await client.run(
                model, SCENARIO_PROMPT, coding_tools(root), SCENARIO_INSTRUCTIONS
            )
        except ClientError as exc:
            progress.end_line()
            print(f"error: {exc}", file=sys.stderr)
            return 1
        finally:
            await client.close()
        progress.end_line()
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
