"""Compaction: a long context becomes a shorter window with a ``compaction`` item
(SPEC: COMPACT-1..COMPACT-6).

The window keeps what the client said verbatim and replaces what the model produced:

* user, system and developer messages are kept as they are;
* the trailing tool round (the function calls and outputs after the last message) is kept, so a
  rollout compacted between a tool output and the model's next step continues from it;
* everything else (assistant messages, earlier tool calls and outputs, reasoning, earlier
  compaction items) is replaced by one ``compaction`` item, which takes the place of the last
  item it replaces (so the current question still comes after it).

Who writes the summary depends on the backend: one with a ``compact`` method does it itself (the
Responses upstream forwards to its ``/responses/compact``; the chat upstream asks its model for a
summary). Every other backend, the simulator included, gets the documented digest below: one
line per replaced item, each cut to a few words, so the same items always give the same summary.

Our own summaries are sealed into ``encrypted_content`` as ``rcmp1.`` + base64url(UTF-8 text):
opaque to clients, as the API promises, but readable here so the renderer shows the model the
summary. An upstream's blob is kept and forwarded unchanged; locally it renders as a short
placeholder.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from engine.compaction_seal import seal, summary_text
from engine.context import Context
from engine.models.base import Backend, Finish, SampleRequest, TextDelta
from engine.pipeline import COMPACT, Pipeline
from engine.tokens import count
from protocol.errors import InvalidRequest
from protocol.items import (
    Compaction,
    FunctionCall,
    FunctionCallOutput,
    InputItem,
    InputText,
    Message,
    OpaqueItem,
    Reasoning,
    item_texts,
    text_of,
)
from protocol.stream import new_id
from protocol.tools import EMPTY_TOOLSET

DIGEST_WORDS = 12  # words kept per replaced item in the digest
TRIGGER = "compaction_trigger"  # the input item that asks for a compaction (COMPACT-7)
DEFAULT_THRESHOLD = 100_000  # prompt tokens, when ``compact_threshold`` is absent or null
SUMMARY_PROMPT = (
    "Summarise the conversation above for your own later use: the facts, decisions, tool "
    "results and open questions a continuation needs. Write plain text, no preamble."
)


# --------------------------------------------------------------------------- the window


@dataclass(frozen=True)
class Window:
    items: list[InputItem]  # the context being compacted
    drop: frozenset[int]  # indices of the items the compaction item stands for
    at: int  # the compaction item goes before ``items[at]``

    @property
    def replaced(self) -> list[InputItem]:
        return [self.items[n] for n in sorted(self.drop)]


def _client_message(item: InputItem) -> bool:
    return isinstance(item, Message) and item.role != "assistant"


def _call_id(item: InputItem) -> str | None:
    """The ``call_id`` of a tool call or tool output of any kind (function, custom …)."""
    value = getattr(item, "call_id", None)
    return value if isinstance(value, str) else None


def _is_output(item: InputItem) -> bool:
    return _call_id(item) is not None and hasattr(item, "output")


def split(items: list[InputItem], keep_round: bool = True) -> Window:
    """What a compaction replaces (COMPACT-2): every item except client messages and the
    trailing tool round. The compaction item takes the place of the last replaced item, so the
    messages after it (the current question) still come last. A client that asked for the
    compaction keeps only its messages and the compaction item (COMPACT-7): then the tool round
    is replaced too (``keep_round=False``)."""
    start = len(items)
    while keep_round and start > 0 and _call_id(items[start - 1]) is not None:
        start -= 1
    calls = {_call_id(i) for i in items[start:] if not _is_output(i)}
    drop = {n for n in range(start) if not _client_message(items[n])}
    for n in range(start, len(items)):
        if _is_output(items[n]) and _call_id(items[n]) not in calls:
            drop.add(n)  # an output whose call is replaced goes with it
    at = max(drop) + 1 if drop else start
    return Window(items, frozenset(drop), at)


def worth_compacting(items: list[InputItem]) -> bool:
    """Whether a compaction would replace anything besides earlier compaction items (COMPACT-3:
    a context that is over the threshold only because of what COMPACT-2 keeps is left alone)."""
    window = split(items)
    return any(not isinstance(items[n], Compaction) for n in window.drop)


def window_items(window: Window, compaction: Compaction) -> list[InputItem]:
    kept = [(n, item) for n, item in enumerate(window.items) if n not in window.drop]
    return [
        *(item for n, item in kept if n < window.at),
        compaction,
        *(item for n, item in kept if n >= window.at),
    ]


def prune(items: list[InputItem]) -> list[InputItem] | None:
    """The context a compaction item stands for (COMPACT-4): the items before the latest
    compaction item that are not client messages are dropped. None when nothing is dropped."""
    last = next(
        (n for n in range(len(items) - 1, -1, -1) if isinstance(items[n], Compaction)), None
    )
    if last is None or all(_client_message(i) for i in items[:last]):
        return None
    return [i for i in items[:last] if _client_message(i)] + items[last:]


def _words(text: str) -> str:
    parts = text.split()
    return " ".join(parts[:DIGEST_WORDS]) + (" …" if len(parts) > DIGEST_WORDS else "")


def _digest_line(item: InputItem) -> str:
    if isinstance(item, Message):
        return f"- {item.role}: {_words(text_of(item.content))}"
    if isinstance(item, FunctionCall):
        return f"- called {item.name}({_words(item.arguments)})"
    if isinstance(item, FunctionCallOutput):
        return f"- tool result: {_words(text_of(item.output))}"
    if isinstance(item, Reasoning):
        return f"- reasoning: {_words(' '.join(s.text for s in item.summary))}"
    if isinstance(item, Compaction):
        return f"- earlier summary: {_words(summary_text(item))}"
    return f"- {_kind(item)}: {_words(' '.join(item_texts(item)))}"


def _kind(item: InputItem) -> str:
    """The wire ``type`` of any item (a tagged struct's tag, or an untyped item's ``type``)."""
    config = getattr(type(item), "__struct_config__", None)
    tag = getattr(config, "tag", None) or getattr(item, "type", None)
    return str(tag or type(item).__name__)


def digest(replaced: list[InputItem]) -> str:
    """The deterministic summary (COMPACT-2): a count, then one short line per replaced item."""
    lines = [f"Summary of {len(replaced)} earlier items:"]
    lines += [_digest_line(item) for item in replaced]
    return "\n".join(lines)


def rebuilt(
    pipeline: Pipeline, old: Context, items: list[InputItem], supports: frozenset[str]
) -> Context:
    """A fresh context with ``old``'s header holding ``items`` (a compacted window)."""
    ctx = Context(findings=old.findings)
    instructions, tools = old.header_key or (None, EMPTY_TOOLSET)
    pipeline.render_header(ctx, instructions, tools)
    pipeline.apply(ctx, items, path=COMPACT, supports=supports)
    return ctx


# --------------------------------------------------------------------------- compacting


@dataclass(frozen=True)
class CompactRequest:
    model: str
    context: Context  # the prepared context: references resolved, rendered
    keep_round: bool = True  # False for a compaction_trigger (COMPACT-7)


@dataclass(frozen=True)
class Compacted:
    items: list[InputItem]  # the new window: what replaces the context
    item: Compaction  # the compaction item in it (the first, for an upstream's window)
    input_tokens: int
    output_tokens: int


Compactor = Callable[[CompactRequest], Awaitable[Compacted]]


def compacted_with(
    window: Window, summary: str, input_tokens: int, output_tokens: int
) -> Compacted:
    item = Compaction(id=new_id("cmp"), encrypted_content=seal(summary))
    return Compacted(window_items(window, item), item, input_tokens, output_tokens)


async def compact(backend: Backend, request: CompactRequest) -> Compacted:
    """Compact ``request.context`` with the backend's own compaction, else the digest."""
    own: Compactor | None = getattr(backend, "compact", None)
    if own is not None:
        return await own(request)
    window = split(request.context.items, request.keep_round)
    summary = digest(window.replaced)
    return compacted_with(window, summary, request.context.prompt_tokens, count(summary))


async def summarise_with_model(backend: Backend, request: CompactRequest) -> Compacted:
    """A summary written by the backend's model (the chat upstream's ``compact``)."""
    window = split(request.context.items, request.keep_round)
    ask = Message(role="user", content=[InputText(text=SUMMARY_PROMPT)])
    scratch = Context(items=[*window.replaced, ask], header_key=request.context.header_key)
    sample = SampleRequest(
        model=request.model,
        context=scratch,
        tools=EMPTY_TOOLSET,
        tool_choice="none",
        parallel_tool_calls=False,
        max_output_tokens=None,
    )
    pieces: list[str] = []
    finish: Finish | None = None
    async for delta in backend.stream(sample):
        if isinstance(delta, TextDelta):
            pieces.append(delta.text)
        elif isinstance(delta, Finish):
            finish = delta
    summary = "".join(pieces).strip()
    prompt = request.context.prompt_tokens
    input_tokens = prompt if finish is None or finish.input_tokens is None else finish.input_tokens
    output_tokens = count(summary) if finish is None else finish.output_tokens
    return compacted_with(window, summary, input_tokens, output_tokens)


def take_trigger(
    items: list[InputItem], texts: list[list[str]]
) -> tuple[list[InputItem], list[list[str]], bool]:
    """Remote compaction (COMPACT-7): a ``compaction_trigger`` must be the last input item; it
    asks for the context to be compacted instead of sampled, and is not itself context.
    Returns the items and texts without it, and whether it was there."""
    for index, item in enumerate(items):
        if isinstance(item, OpaqueItem) and item.type == TRIGGER and index != len(items) - 1:
            raise InvalidRequest(
                "invalid_value",
                "A compaction_trigger item must be the final input item.",
                f"input[{index}]",
            )
    if items and isinstance(items[-1], OpaqueItem) and items[-1].type == TRIGGER:
        return items[:-1], texts[:-1], True
    return items, texts, False


def compaction_threshold(context_management: object) -> int | None:
    """The ``compact_threshold`` of a create's ``context_management`` (COMPACT-3), or None.

    The SDK types it as a list of ``{"type": "compaction", "compact_threshold": int | null}``;
    entries of other types are ignored (LEN-1)."""
    if context_management is None:
        return None
    if not isinstance(context_management, list):
        raise InvalidRequest(
            "invalid_type",
            "Invalid type for 'context_management': expected array.",
            "context_management",
        )
    for index, entry in enumerate(context_management):
        where = f"context_management[{index}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("type"), str):
            raise InvalidRequest(
                "invalid_type", f"Invalid type for '{where}': expected object with type.", where
            )
        if entry["type"] != "compaction":
            continue
        threshold = entry.get("compact_threshold")
        if threshold is None:
            return DEFAULT_THRESHOLD
        if not isinstance(threshold, int) or isinstance(threshold, bool) or threshold < 0:
            raise InvalidRequest(
                "invalid_value",
                f"Invalid value for '{where}.compact_threshold': expected a non-negative integer.",
                f"{where}.compact_threshold",
            )
        return threshold
    return None
