"""Pre-inference pipeline: validate -> scan -> render (SPEC: PIPE-1..PIPE-6).

Every stage has one code path used two ways: over a full history (stateless requests, store
hydration) and over only the new items of a live rollout (append mode, compat fast path,
connection-cache continuations). ``apply`` is atomic: if validation fails nothing changes, so a
rejected request leaves the rollout exactly as it was.

Routing is not a stage here: the create resolves its backend first (``route``, OBS-1, in
``connection/compat.py``), because validation depends on what that backend can read; ``apply``
takes the backend's ``supports``.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, cast

import msgspec
import numpy as np

from engine.conversation.carried import CarriedRun, take_carried
from engine.conversation.context import Context
from engine.conversation.footprint import DICT_ENTRY, LIST_SLOT, SET_ENTRY, deep_size
from engine.conversation.render import estimate_header, estimate_item, render_header, render_item
from engine.conversation.safety import Finding, keep_findings, redact, scan_text
from engine.conversation.sealed import KeyRing, SealedRun, is_sealed
from engine.conversation.tokens import TokenArray
from engine.conversation.validation import (
    resolve_references,
    validate,
    validate_tool_choice,
    validate_tools,
)
from protocol.errors import invalid_encrypted_content
from protocol.items import (
    ContentPart,
    CustomToolCall,
    CustomToolCallOutput,
    FunctionCall,
    FunctionCallOutput,
    InputItem,
    InputText,
    Message,
    OpaqueItem,
    OutputText,
    Reasoning,
    ReasoningText,
    Refusal,
    ToolCall,
    ToolOutput,
    item_texts,
)
from protocol.tools import EMPTY_TOOLSET, ToolChoice, Toolset

FULL = "full"
INCREMENTAL = "incremental"
OUTPUT = "output"  # the model's own output joining the context
COMPACT = "compact"  # a compacted window replacing the context (COMPACT-3, COMPACT-4)


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


# --------------------------------------------------------------------------- stages


ItemTexts = list[list[str]]  # ``item_texts`` of each item of a batch, in order


def scan(ctx: Context, texts: ItemTexts) -> list[Finding]:
    base = len(ctx.items)
    found: list[Finding] = []
    for offset, readable in enumerate(texts):
        for text in readable:
            found.extend(scan_text(text, base + offset))
    return found


def texts_of(
    given: list[InputItem], resolved: list[InputItem], known: ItemTexts | None
) -> ItemTexts:
    """Each resolved item's texts, computed once per item: reused when the caller already has
    them (the create's size limit, LIM-15), except for a resolved reference, which reads as the
    item it names (ITEM-4)."""
    if known is None:
        return [item_texts(item) for item in resolved]
    return [
        texts if item is named else item_texts(named)
        for item, named, texts in zip(given, resolved, known, strict=True)
    ]


def redact_item(item: InputItem) -> InputItem:
    """The item as the model may read it under the ``redact`` policy (SAFE-3)."""
    if isinstance(item, Message):
        return msgspec.structs.replace(item, content=_redact_content(item.content))
    if isinstance(item, ToolOutput):
        return msgspec.structs.replace(item, output=_redact_content(item.output))
    if isinstance(item, FunctionCall):
        return msgspec.structs.replace(item, arguments=redact(item.arguments))
    if isinstance(item, CustomToolCall):
        return msgspec.structs.replace(item, input=redact(item.input))
    if isinstance(item, Reasoning):
        summary = [msgspec.structs.replace(s, text=redact(s.text)) for s in item.summary or ()]
        content = [msgspec.structs.replace(c, text=redact(c.text)) for c in item.content or ()]
        return msgspec.structs.replace(
            item,
            summary=summary if item.summary is not None else None,
            content=content if item.content is not None else None,
        )
    if isinstance(item, OpaqueItem):  # every string the model reads of it (ITEM-7)
        return OpaqueItem(
            {k: v if k in ("type", "id") else _redact_json(v) for k, v in item.data.items()}
        )
    return item


def _redact_json(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: _redact_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact_json(v) for v in value]
    return value


def _redact_content(content: str | list[ContentPart]) -> str | list[ContentPart]:
    if isinstance(content, str):
        return redact(content)
    return [_redact_part(part) for part in content]


def _redact_part(part: ContentPart) -> ContentPart:
    if isinstance(part, InputText | OutputText):
        return msgspec.structs.replace(part, text=redact(part.text))
    if isinstance(part, Refusal):
        return msgspec.structs.replace(part, refusal=redact(part.refusal))
    return part


@dataclass
class TurnLog:
    """What pre-inference did for one response: stage seconds and safety findings."""

    seconds: dict[str, float] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)  # the first MAX_FINDINGS (SAFE-5)
    finding_kinds: Counter[str] = field(default_factory=Counter)  # every finding, by kind
    # With tracing on (OTEL-3): each stage's (name, end time in ns, seconds), for its span.
    marks: list[tuple[str, int, float]] | None = None

    def note(self, findings: list[Finding]) -> None:
        keep_findings(self.findings, findings)
        self.finding_kinds.update(f.kind for f in findings)

    def add_time(self, stage: str, seconds: float) -> None:
        self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds
        if self.marks is not None:
            self.marks.append((stage, time.time_ns(), seconds))


# --------------------------------------------------------------------------- the pipeline


class Pipeline:
    """Runs the stages over new items and commits them into a ``Context`` atomically.

    ``log`` is the current response's ``TurnLog``; the rollout points it at each new turn."""

    def __init__(self, stats: StageStats, policy: str = "flag", estimate: bool = False) -> None:
        self.stats = stats
        self.policy = policy
        self.keys: KeyRing | None = None  # opens sealed reasoning (SEAL-4); None: untouched
        self.owner: str | None = None  # whose blobs open (SEAL-2)
        self.log = TurnLog()
        # A backend that renders the model's own tokens needs only our counts (TOK-10).
        self._render = estimate_item if estimate else render_item
        self._estimate = estimate

    def seal_keys(self, keys: KeyRing, owner: str | None) -> None:
        """Open the sealed reasoning of ``owner`` with ``keys`` from now on (SEAL-4)."""
        self.keys, self.owner = keys, owner

    def apply(
        self,
        ctx: Context,
        items: list[InputItem],
        *,
        path: str,
        supports: frozenset[str],
        param: str = "input",
        texts: ItemTexts | None = None,
    ) -> int:
        """Validate, scan and render ``items`` onto ``ctx``; returns tokens rendered.

        ``texts``: each item's ``item_texts`` when the caller already computed them."""
        t = time.perf_counter()
        given, items = items, resolve_references(ctx, items, param)
        validate(ctx, items, supports, param)
        runs: dict[int, SealedRun] = {}
        carried: dict[int, CarriedRun] | None = None
        if param == "input" and path in (FULL, INCREMENTAL):  # what the client sent (SEAL-4)
            items = self._open_sealed(len(ctx.items), given, items, param, runs)
            carried = {} if self._estimate else None
        if path != OUTPUT:  # training fields never enter the context (TOK-62)
            items = take_carried(items, len(ctx.items), param, carried)
        t = self._count("validate", path, len(items), t)
        # The model's own output is not scanned: the scan guards what enters from outside.
        # Nor is a compacted window: its items were scanned when they entered.
        findings = scan(ctx, texts_of(given, items, texts)) if path not in (OUTPUT, COMPACT) else []
        if findings and self.policy == "redact":
            items = self._redacted(ctx, items, findings)
        t = self._count("scan", path, len(items), t)
        rendered = [self._render(item) for item in items]
        self._count("render", path, len(items), t)
        total = self._commit(ctx, items, rendered, findings)
        ctx.sealed.update(runs)
        if carried:
            ctx.carried = {**ctx.carried, **carried} if ctx.carried else carried
        self.stats.tokens[path] += total
        return total

    def _open_sealed(
        self,
        base: int,
        given: list[InputItem],
        items: list[InputItem],
        param: str,
        runs: dict[int, SealedRun],
    ) -> list[InputItem]:
        """Open the sealed reasoning the client sent back (SEAL-4, SEAL-7): a blob of ours
        that does not open is ``invalid_encrypted_content`` naming the item; an opened one
        gives the item its text (clients may send the blob alone) and, for a backend that
        renders the model's own tokens, the sampled run it belongs to. Items an
        ``item_reference`` brought from the context were opened when they entered."""
        keys, out = self.keys, items
        if keys is None:
            return items
        for n, item in enumerate(items):
            if type(item) is not Reasoning or item is not given[n]:
                continue
            blob = item.encrypted_content
            if blob is None or not is_sealed(blob):
                continue  # someone else's opaque blob passes untouched (ITEM-5, SEAL-6)
            sealed = keys.open(blob, self.owner, item.id)
            if sealed is None:
                raise invalid_encrypted_content(item.id, f"{param}[{n}].encrypted_content")
            if not item.content:
                if out is items:
                    out = list(items)
                out[n] = msgspec.structs.replace(item, content=[ReasoningText(text=sealed.text)])
            if sealed.ids is not None and self._estimate and n >= sealed.lead:
                run = SealedRun(sealed.ids, sealed.lead + sealed.items, sealed.model)
                runs[base + n - sealed.lead] = run
        return out

    @staticmethod
    def _redacted(ctx: Context, items: list[InputItem], found: list[Finding]) -> list[InputItem]:
        base = len(ctx.items)
        dirty = {f.item_index - base for f in found if f.kind != "prompt_injection"}
        return [redact_item(item) if n in dirty else item for n, item in enumerate(items)]

    def render_header(
        self,
        ctx: Context,
        instructions: str | None,
        tools: Toolset,
        choice: ToolChoice = "auto",
        runs_hosted: bool = False,
    ) -> int:
        """(Re-)render the instructions/tools header only when it changed (PIPE-4).

        Returns the number of tokens rendered (0 when the cached header was reused)."""
        validate_tool_choice(tools, choice, runs_hosted)
        key = (instructions, tools)
        if ctx.header_key == key:
            return 0
        t = time.perf_counter()
        validate_tools(tools)
        if self._estimate:
            ctx.header = estimate_header(instructions, tools)
        else:
            ctx.header = np.asarray(render_header(instructions, tools), dtype=np.int32)
        ctx.header_key = key
        self.stats.tokens_rendered += len(ctx.header)
        self.stats.tokens["header"] += len(ctx.header)
        self._count("header", "render", 1, t)
        return len(ctx.header)

    def _count(self, stage: str, path: str, n: int, start: float) -> float:
        key, stats = f"{stage}.{path}", self.stats
        stats.runs[key] += 1
        stats.items[key] += n
        now = time.perf_counter()  # the stage's time, in the same frame (three a batch)
        seconds = stats.seconds
        seconds[stage] = seconds.get(stage, 0.0) + now - start
        self.log.add_time(stage, now - start)
        return now

    def _commit(
        self,
        ctx: Context,
        items: list[InputItem],
        rendered: list[TokenArray | int],
        findings: list[Finding],
    ) -> int:
        total = 0
        size = 0
        for item, ids in zip(items, rendered, strict=True):
            ctx.items.append(item)
            # what the item really occupies, its ledger entries included (MEM-10)
            size += deep_size(item) + LIST_SLOT
            if isinstance(ids, int):  # an estimated count (TOK-10, UP-8)
                ctx.tokens.pad(ids)
                total += ids
            else:
                ctx.tokens.extend(ids)
                total += len(ids)
            item_id = getattr(item, "id", None)
            if item_id:
                ctx.by_id[item_id] = item
                size += DICT_ENTRY
            kind = type(item)  # exact types: a missed ``isinstance`` of a union costs ~0.6 us
            if kind is FunctionCall or kind is CustomToolCall:
                call = cast(ToolCall, item)
                ctx.calls[call.call_id] = call
                size += 2 * DICT_ENTRY
                if call.call_id not in ctx.answered:
                    ctx.unanswered[call.call_id] = call
            elif kind is FunctionCallOutput or kind is CustomToolCallOutput:
                item = cast(ToolOutput, item)
                ctx.answered.add(item.call_id)
                size += SET_ENTRY
                ctx.unanswered.pop(item.call_id, None)
        ctx.nbytes += size
        if findings:  # the usual turn has none: no Counter update, no slice
            keep_findings(ctx.findings, findings)
            self.log.note(findings)
        self.stats.tokens_rendered += total
        return total


def rebuilt(
    pipeline: Pipeline, old: Context, items: list[InputItem], supports: frozenset[str]
) -> Context:
    """A fresh context with ``old``'s header holding ``items`` (a compacted window)."""
    ctx = Context(findings=old.findings)
    instructions, tools = old.header_key or (None, EMPTY_TOOLSET)
    pipeline.render_header(ctx, instructions, tools)
    pipeline.apply(ctx, items, path=COMPACT, supports=supports)
    return ctx
