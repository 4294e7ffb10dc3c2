"""Compaction: a long context becomes a shorter window with a ``compaction`` item
(SPEC: COMPACT-1..COMPACT-6).

The window keeps what the client said verbatim and replaces what the model produced:

* user, system and developer messages are kept as they are;
* the trailing tool round (the function calls and outputs after the last message) is kept, so a
  rollout compacted between a tool output and the model's next step continues from it;
* everything else (assistant messages, earlier tool calls and outputs, reasoning, earlier
  compaction items) is replaced by one ``compaction`` item, which takes the place of the last
  item it replaces (so the current question still comes after it).

This module is the window and the seal (no model call); ``engine.models.compaction`` runs
the compaction with a backend. Who writes the summary depends on the backend: one with a
``compact`` method does it itself (the
Responses upstream forwards to its ``/responses/compact``; the chat upstream asks its model for a
summary). Every other backend, the simulator included, gets the documented digest below: one
line per replaced item, each cut to a few words, so the same items always give the same summary.

Our own summaries are sealed into ``encrypted_content`` as ``rcmp1.`` + base64url(UTF-8 text):
opaque to clients, as the API promises, but readable here so the renderer shows the model the
summary. An upstream's blob is kept and forwarded unchanged; locally it renders as a short
placeholder.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass

from protocol.errors import InvalidRequest
from protocol.items import (
    Compaction,
    FunctionCall,
    FunctionCallOutput,
    InputItem,
    Message,
    OpaqueItem,
    Reasoning,
    item_texts,
    text_of,
)

DIGEST_WORDS = 12  # words kept per replaced item in the digest
TRIGGER = "compaction_trigger"  # the input item that asks for a compaction (COMPACT-7)
DEFAULT_THRESHOLD = 100_000  # prompt tokens, when ``compact_threshold`` is absent or null


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
        return f"- reasoning: {_words(' '.join(s.text for s in item.summary or ()))}"
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


# --------------------------------------------------------------------------- the seal

SEAL = "rcmp1."


def seal(summary: str) -> str:
    return SEAL + base64.urlsafe_b64encode(summary.encode()).decode()


def unseal(blob: str) -> str | None:
    """The summary this server sealed, or None for an upstream's (or a client's) own blob."""
    if not blob.startswith(SEAL):
        return None
    try:
        raw = base64.b64decode(blob[len(SEAL) :].encode(), altchars=b"-_", validate=True)
        return raw.decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None


def summary_text(item: Compaction) -> str:
    """What the model reads for a compaction item (render, chat upstream)."""
    summary = unseal(item.encrypted_content)
    if summary is not None:
        return summary
    tag = hashlib.sha1(item.encrypted_content.encode(), usedforsecurity=False).hexdigest()[:12]
    return f"[compacted context {tag}]"


def take_trigger(
    items: list[InputItem], texts: list[list[str]]
) -> tuple[list[InputItem], list[list[str]], bool]:
    """Remote compaction (COMPACT-7): a ``compaction_trigger`` must be the last input item; it
    asks for the context to be compacted instead of sampled, and is not itself context.
    Returns the items and texts without it, and whether it was there."""
    for index, item in enumerate(items):
        if type(item) is OpaqueItem and item.type == TRIGGER and index != len(items) - 1:
            raise InvalidRequest(
                "invalid_value",
                "A compaction_trigger item must be the final input item.",
                f"input[{index}]",
            )
    if items and type(items[-1]) is OpaqueItem and items[-1].type == TRIGGER:
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
