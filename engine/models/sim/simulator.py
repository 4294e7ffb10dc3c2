"""The simulated model: a documented, deterministic stand-in for an inference server (SIM-1..SIM-5).

* Streams one delta per token at a configurable rate (default 1,000 tokens/s); token counts come
  from the real cl100k tokenizer. The pacing is the only simulated time in the system.
* Policy: no usable tools -> a text answer. Tools defined, ``tool_choice`` not ``none`` and the last
  item a user message -> a call of each tool named in the user text (only the first unless
  ``parallel_tool_calls``), else of the first tool, with arguments valid for its JSON schema and
  plausible by parameter name (``schema_args``). Last item a tool output -> a text answer, unless
  ``tool_choice`` is ``required`` or names a tool (then that call again).
* Usable tools are the callable ones: functions, custom tools and the functions inside
  namespaces (a call carries its ``namespace``). Hosted tools are never called (TOOL-4), except
  remote MCP tools, which the rollout offers as functions (MCP-6): the same policy calls them
  (SIM-7: "use the echo tool" calls a listed ``echo``), and an ``mcp_list_tools`` item in the
  context is not the last item the policy looks at.
* Steering shows (SIM-6): a steered successor's context ends with the steering message, so the
  answer quotes it (or calls the tools it names); steering queued behind tool calls sits right
  before their outputs, and the answer to those outputs adds ``(steered: <its words>)``.
* A scenario (model ``sim-coding-agent``) follows a script instead; see ``scenarios``.
* Call ids are derived from the conversation, so the same history yields the same output.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from functools import lru_cache

from engine.conversation.tokens import encode, encoding
from engine.models.base import (
    ArgsDelta,
    Backend,
    CallEnd,
    CallStart,
    Delta,
    Finish,
    SampleRequest,
    TextDelta,
)
from engine.models.sim.scenarios import SCENARIOS
from engine.models.sim.schema_args import arguments_for, command_like
from protocol.items import InputItem, Message, OpaqueItem, ToolOutput, text_of
from protocol.tools import CallableTool, ToolChoice, ToolChoiceAllowed, forced_callable

_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_\-]*")


@dataclass(frozen=True, slots=True)
class PlannedCall:
    name: str
    arguments: str  # JSON for a function; free text for a custom tool
    namespace: str | None = None
    custom: bool = False


@dataclass(frozen=True, slots=True)
class Plan:
    text: str | None
    calls: list[PlannedCall]


@lru_cache(maxsize=1024)
def _cached_pieces(text: str) -> tuple[str, ...]:
    """A scripted model repeats its calls' arguments: split each text once (the model's own
    CPU is part of a turn's server CPU, so it is kept small too)."""
    return tuple(token_pieces(text))


def token_pieces(text: str) -> list[str]:
    """Split text into per-token strings, never cutting a multi-byte character."""
    enc = encoding()
    pieces: list[str] = []
    pending = b""
    for token in encode(text):
        pending += enc.decode_single_token_bytes(token)
        try:
            pieces.append(pending.decode("utf-8"))
            pending = b""
        except UnicodeDecodeError:
            continue
    if pending:
        pieces.append(pending.decode("utf-8", errors="replace"))
    return pieces


def _hint(text: str) -> str:
    """A plausible string argument from the user's words: the last capitalised word, else last."""
    words = _WORD.findall(text)
    capitalised = [w for w in words if w[0].isupper()]
    chosen: str = (capitalised or words or ["value"])[-1]
    return chosen


class SimulatedModel(Backend):
    """Deterministic simulated model; see the module docstring for its documented policy."""

    name = "sim"
    supports = frozenset({"text", "image"})

    def __init__(self, tokens_per_second: float, scenario: str | None = None) -> None:
        if scenario is not None and scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {scenario!r}")
        self.tokens_per_second = tokens_per_second
        self.scenario = scenario

    # ------------------------------------------------------------------ policy
    def plan(self, request: SampleRequest) -> Plan:
        items = request.context.items
        choice = request.tool_choice
        tools = _usable(list(request.tools.callables), choice)
        if self.scenario is not None:
            return self._scripted(items, tools)
        last = next((i for i in reversed(items) if not _listing(i)), None)
        if not tools or last is None:
            return Plan(self._answer(items), [])
        forced = choice == "required" or forced_callable(choice) is not None
        if isinstance(choice, ToolChoiceAllowed) and choice.mode == "required":
            forced = True
        if isinstance(last, Message) and last.role in ("user", "developer", "system"):
            return Plan(None, self._calls_for_user(text_of(last.content), tools, request))
        if isinstance(last, ToolOutput) and forced:
            return Plan(None, self._calls_for_user("", tools[:1], request))
        return Plan(self._answer(items), [])

    def _calls_for_user(
        self, text: str, tools: list[CallableTool], request: SampleRequest
    ) -> list[PlannedCall]:
        lowered = text.lower()
        named = [t for t in tools if t.name.lower() in lowered] or tools[:1]
        if not request.parallel_tool_calls:
            named = named[:1]
        hint = _hint(text)
        return [_planned(t, hint) for t in named]

    def _scripted(self, items: list[InputItem], tools: list[CallableTool]) -> Plan:
        assert self.scenario is not None
        steps, final = SCENARIOS[self.scenario]
        step = sum(1 for item in items if isinstance(item, ToolOutput))
        names = {t.name for t in tools}
        if step < len(steps) and steps[step].name in names:
            call = steps[step]
            return Plan(None, [PlannedCall(call.name, call.arguments_json())])
        return Plan(final, [])

    @staticmethod
    def _answer(items: list[InputItem]) -> str:
        outputs: list[ToolOutput] = []
        steering: list[str] = []  # user messages right before the outputs (SIM-6)
        for item in reversed(items):
            if isinstance(item, ToolOutput) and not steering:
                outputs.append(item)
            elif outputs and isinstance(item, Message) and item.role == "user":
                steering.append(_excerpt(text_of(item.content), 24))
            else:
                break
        if outputs:
            shown = "; ".join(_excerpt(text_of(o.output), 24) for o in reversed(outputs))
            if steering:
                shown += f" (steered: {'; '.join(reversed(steering))})"
            return f"Based on the tool results: {shown}"
        user = next((text_of(i.content) for i in reversed(items) if isinstance(i, Message)), "")
        return f"This is a simulated answer to: {_excerpt(user, 40)}"

    # ------------------------------------------------------------------ streaming
    async def stream(self, request: SampleRequest) -> AsyncGenerator[Delta, None]:
        plan = self.plan(request)
        tokens = _TokenBudget(request.max_output_tokens, _Pacer(self.tokens_per_second))
        if plan.text is not None:
            async for piece in tokens.paced(_cached_pieces(plan.text)):
                yield TextDelta(piece)
        for index, call in enumerate(plan.calls):
            if tokens.exhausted:
                break
            call_id = self._call_id(request, index, call.name)
            yield CallStart(call_id, call.name, call.namespace, call.custom)
            async for piece in tokens.paced(_cached_pieces(call.arguments)):
                yield ArgsDelta(piece)
            if not tokens.exhausted:
                yield CallEnd()
        if tokens.exhausted:
            yield Finish("length", tokens.produced)
        else:
            yield Finish("tool_calls" if plan.calls else "stop", tokens.produced)

    @staticmethod
    def _call_id(request: SampleRequest, index: int, name: str) -> str:
        seed = f"{len(request.context.items)}:{request.context.prompt_tokens}:{index}:{name}"
        return "call_" + hashlib.sha256(seed.encode()).hexdigest()[:24]


def _listing(item: InputItem) -> bool:
    """An ``mcp_list_tools`` item: the rollout's, not a turn of the conversation (SIM-7)."""
    return isinstance(item, OpaqueItem) and item.type == "mcp_list_tools"


def _usable(tools: list[CallableTool], choice: ToolChoice) -> list[CallableTool]:
    """The tools the simulator may call under ``tool_choice`` (hosted tools never are)."""
    if choice == "none":
        return []
    name = forced_callable(choice)
    if name is not None:
        return [t for t in tools if t.name == name] or tools
    if isinstance(choice, ToolChoiceAllowed):
        allowed = {str(t.get("name")) for t in choice.tools}
        return [t for t in tools if t.name in allowed]
    return tools


def _planned(tool: CallableTool, hint: str) -> PlannedCall:
    """A call with plausible input: schema-valid JSON arguments (SIM-7), or for a custom tool a
    short free-form text (``_free_text``)."""
    if tool.custom:
        return PlannedCall(tool.name, _free_text(tool.name, hint), tool.namespace, custom=True)
    arguments = json.dumps(arguments_for(tool.parameters, hint), separators=(",", ":"))
    return PlannedCall(tool.name, arguments, tool.namespace)


def _free_text(name: str, hint: str) -> str:
    """A custom tool's input: a patch that adds one small file for a patch tool (the format of
    Codex's ``apply_patch``), a read-only command for a command-like tool, else the hint."""
    lowered = name.lower()
    if "patch" in lowered:
        return f"*** Begin Patch\n*** Add File: notes.txt\n+{hint}\n*** End Patch\n"
    if command_like(name) or "shell" in lowered:
        return "ls"
    return hint


def _excerpt(text: str, words: int) -> str:
    parts = text.split()
    return " ".join(parts[:words]) + (" …" if len(parts) > words else "")


class _TokenBudget:
    """Counts output tokens against ``max_output_tokens`` and paces them."""

    __slots__ = ("_budget", "_pacer", "exhausted", "produced")

    def __init__(self, budget: int | None, pacer: _Pacer) -> None:
        self._budget = budget
        self._pacer = pacer
        self.produced = 0
        self.exhausted = False

    async def paced(self, pieces: Sequence[str]) -> AsyncGenerator[str, None]:
        for piece in pieces:
            if self._budget is not None and self.produced >= self._budget:
                self.exhausted = True
                return
            await self._pacer.tick(self.produced)
            self.produced += 1
            yield piece


class _Pacer:
    """Deadline pacing: token n is due at start + n/rate; sleeps only when ahead of schedule."""

    __slots__ = ("_interval", "_loop", "_start")

    def __init__(self, tokens_per_second: float) -> None:
        self._interval = 1.0 / tokens_per_second if tokens_per_second > 0 else 0.0
        self._loop = asyncio.get_running_loop()
        self._start = self._loop.time()

    async def tick(self, produced: int) -> None:
        if not self._interval:
            return
        ahead = self._start + (produced + 1) * self._interval - self._loop.time()
        if ahead > 0.0005:
            await asyncio.sleep(ahead)
