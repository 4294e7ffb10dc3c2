"""Pre-inference pipeline: route -> validate -> scan -> render (SPEC: PIPE-1..PIPE-6).

Every stage has one code path used two ways: over a full history (stateless requests, store
hydration) and over only the new items of a live rollout (append mode, compat fast path,
connection-cache continuations). ``apply`` is atomic: if validation fails nothing changes, so a
rejected request leaves the rollout exactly as it was.

Routing runs first because validation depends on what the chosen backend can read.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from engine.render import render_header, render_item
from engine.safety import Finding, scan_text
from engine.tokens import TokenBuffer
from protocol.errors import InvalidRequest
from protocol.items import (
    FunctionCall,
    FunctionCallOutput,
    InputFile,
    InputImage,
    InputItem,
    ItemReference,
    Message,
    item_texts,
)
from protocol.response import Tool

FULL = "full"
INCREMENTAL = "incremental"


@dataclass
class StageStats:
    """Counters a test (or an operator) can read to prove what ran and how much it touched."""

    runs: Counter[str] = field(default_factory=Counter)  # "validate.full", "render.incremental" …
    items: Counter[str] = field(default_factory=Counter)  # items processed per stage.path
    tokens_rendered: int = 0
    tokens: Counter[str] = field(default_factory=Counter)  # tokens rendered per path
    seconds: dict[str, float] = field(default_factory=dict)  # time per stage

    def add(self, other: StageStats) -> None:
        self.runs.update(other.runs)
        self.items.update(other.items)
        self.tokens_rendered += other.tokens_rendered
        self.tokens.update(other.tokens)
        for name, value in other.seconds.items():
            self.seconds[name] = self.seconds.get(name, 0.0) + value


@dataclass
class Context:
    """A rollout's processed conversation: items, rendered tokens, tool-call ledger."""

    items: list[InputItem] = field(default_factory=list)
    tokens: TokenBuffer = field(default_factory=TokenBuffer)
    calls: dict[str, FunctionCall] = field(default_factory=dict)
    answered: set[str] = field(default_factory=set)
    by_id: dict[str, InputItem] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    header_key: tuple[str | None, tuple[Tool, ...]] | None = None
    header: list[int] = field(default_factory=list)

    @property
    def prompt_tokens(self) -> int:
        return len(self.header) + len(self.tokens)

    def fork(self) -> Context:
        """An independent copy (token array copied once; items shared, they are immutable)."""
        return Context(
            items=list(self.items),
            tokens=self.tokens.copy(),
            calls=dict(self.calls),
            answered=set(self.answered),
            by_id=dict(self.by_id),
            findings=list(self.findings),
            header_key=self.header_key,
            header=self.header,
        )

    def pending_calls(self) -> list[FunctionCall]:
        return [c for cid, c in self.calls.items() if cid not in self.answered]


# --------------------------------------------------------------------------- stages


def resolve_references(ctx: Context, items: list[InputItem], param: str) -> list[InputItem]:
    """Replace ``item_reference`` items by the items they name (ITEM-4)."""
    if not any(isinstance(i, ItemReference) for i in items):
        return items
    out: list[InputItem] = []
    local = {i.id: i for i in items if getattr(i, "id", None) and not isinstance(i, ItemReference)}
    for index, item in enumerate(items):
        if isinstance(item, ItemReference):
            found = ctx.by_id.get(item.id) or local.get(item.id)
            if found is None:
                raise InvalidRequest(
                    "item_not_found",
                    f"Item with id '{item.id}' not found in this conversation.",
                    f"{param}[{index}].id",
                )
            out.append(found)
        else:
            out.append(item)
    return out


def validate(
    ctx: Context, items: list[InputItem], supports: frozenset[str], param: str = "input"
) -> None:
    """Semantic checks the schema cannot express (VAL-1..VAL-4)."""
    calls = set(ctx.calls)
    answered = set(ctx.answered)
    for index, item in enumerate(items):
        where = f"{param}[{index}]"
        if isinstance(item, FunctionCall):
            calls.add(item.call_id)
        elif isinstance(item, FunctionCallOutput):
            if item.call_id not in calls:
                raise InvalidRequest(
                    "unknown_call_id",
                    f"No tool call found for function call output with call_id '{item.call_id}'.",
                    f"{where}.call_id",
                )
            if item.call_id in answered:
                raise InvalidRequest(
                    "duplicate_tool_output",
                    f"Duplicate function call output for call_id '{item.call_id}'.",
                    f"{where}.call_id",
                )
            answered.add(item.call_id)
            _check_content(item.output, supports, f"{where}.output")
        elif isinstance(item, Message):
            _check_content(item.content, supports, f"{where}.content")


def _check_content(content: object, supports: frozenset[str], where: str) -> None:
    if isinstance(content, str):
        return
    assert isinstance(content, list)
    for index, part in enumerate(content):
        kind = (
            "image"
            if isinstance(part, InputImage)
            else "file"
            if isinstance(part, InputFile)
            else "text"
        )
        if kind not in supports:
            raise InvalidRequest(
                "unsupported_content",
                f"The selected model does not accept {kind} input.",
                f"{where}[{index}].type",
            )


def validate_tools(tools: list[Tool]) -> None:
    seen: set[str] = set()
    for index, tool in enumerate(tools):
        if not tool.name or tool.name in seen:
            raise InvalidRequest(
                "invalid_value",
                f"Tool names must be non-empty and unique; '{tool.name}' is not.",
                f"tools[{index}].name",
            )
        seen.add(tool.name)
        params = tool.parameters
        if params is not None and params.get("type", "object") != "object":
            raise InvalidRequest(
                "invalid_value",
                "Function parameters must be a JSON Schema of type 'object'.",
                f"tools[{index}].parameters",
            )


def scan(ctx: Context, items: list[InputItem]) -> list[Finding]:
    base = len(ctx.items)
    found: list[Finding] = []
    for offset, item in enumerate(items):
        for text in item_texts(item):
            found.extend(scan_text(text, base + offset))
    return found


# --------------------------------------------------------------------------- the pipeline


class Pipeline:
    """Runs the stages over new items and commits them into a ``Context`` atomically."""

    def __init__(self, stats: StageStats) -> None:
        self.stats = stats

    def _timed(self, name: str, start: float) -> float:
        now = time.perf_counter()
        self.stats.seconds[name] = self.stats.seconds.get(name, 0.0) + now - start
        return now

    def apply(
        self,
        ctx: Context,
        items: list[InputItem],
        *,
        path: str,
        supports: frozenset[str],
        param: str = "input",
    ) -> int:
        """Validate, scan and render ``items`` onto ``ctx``; returns tokens rendered."""
        t = time.perf_counter()
        items = resolve_references(ctx, items, param)
        validate(ctx, items, supports, param)
        t = self._count("validate", path, len(items), t)
        findings = scan(ctx, items)
        t = self._count("scan", path, len(items), t)
        rendered = [render_item(item) for item in items]
        self._count("render", path, len(items), t)
        total = self._commit(ctx, items, rendered, findings)
        self.stats.tokens[path] += total
        return total

    def render_header(self, ctx: Context, instructions: str | None, tools: list[Tool]) -> int:
        """(Re-)render the instructions/tools header only when it changed (PIPE-4).

        Returns the number of tokens rendered (0 when the cached header was reused)."""
        key = (instructions, tuple(tools))
        if ctx.header_key == key:
            return 0
        t = time.perf_counter()
        validate_tools(tools)
        ctx.header = render_header(instructions, tools)
        ctx.header_key = key
        self.stats.tokens_rendered += len(ctx.header)
        self.stats.tokens["header"] += len(ctx.header)
        self._count("header", "render", 1, t)
        return len(ctx.header)

    def _count(self, stage: str, path: str, n: int, start: float) -> float:
        self.stats.runs[f"{stage}.{path}"] += 1
        self.stats.items[f"{stage}.{path}"] += n
        return self._timed(stage, start)

    def _commit(
        self,
        ctx: Context,
        items: list[InputItem],
        rendered: list[list[int]],
        findings: list[Finding],
    ) -> int:
        total = 0
        for item, ids in zip(items, rendered, strict=True):
            ctx.items.append(item)
            ctx.tokens.extend(ids)
            total += len(ids)
            item_id = getattr(item, "id", None)
            if item_id:
                ctx.by_id[item_id] = item
            if isinstance(item, FunctionCall):
                ctx.calls[item.call_id] = item
            elif isinstance(item, FunctionCallOutput):
                ctx.answered.add(item.call_id)
        ctx.findings.extend(findings)
        self.stats.tokens_rendered += total
        return total
