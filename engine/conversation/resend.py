"""What makes a resent item the same item (SPEC: COMPAT-7, COMPAT-8).

A client that keeps its own history (the openai SDK's loops, verifiers, NeMo Gym, Codex with
``store: false``) sends the whole item list every turn: the input it sent before and the output
it received, in the SDK's shapes. The loader continues the context of a response whose full
item list the input begins with (``connection/loader.py``, ``LoadPath.RESENT``); this module
says when two items are the same for that purpose, and digests a list of items so that the
question is one dictionary lookup per candidate prefix, never a render.

An item's *canonical form* keeps what the model reads of it and what the context's ledger
keys on, and nothing else:

- dropped: ``id``, ``status`` and the training fields (TOK-60) of every item; a text part's
  ``annotations`` and ``logprobs``;
- the same: a message's or tool output's string content and a list holding one text part of
  that text; an ``input_text`` and an ``output_text`` part of the same text; a reasoning
  item's ``summary`` or ``content`` absent and empty;
- kept, so any difference starts afresh: the item's type, a message's role, ``phase`` and
  every part's text (images and files by every field), a call's ``call_id``, ``name``,
  ``namespace`` and ``arguments`` (or ``input``) byte for byte, an output's ``call_id`` and
  content, a reasoning item's texts and ``encrypted_content``, a compaction's blob, every
  other item's JSON but its ``id`` and ``status`` (ITEM-7).

A process finds the list a resend begins with by its length and its last item's digest
(``item_digest``: one encoding and one hash, of that item only), then compares the lists item
for item (``holds``: one comparison in C when the items are equal, the canonical forms of those
that differ), so a matched history costs no encoding or hash per item it holds.

Before any of that, an HTTP create's items are raw JSON (``protocol.response.HttpCreateParams``),
and a client re-serializes its history to the same bytes every turn: the first items of a
resend whose bytes equal an earlier create's input (``Sent``, remembered with that create's
cached response) are that create's decoded items, texts and sizes, and are not decoded again
(``Held``; ``HydrationCache.held`` finds them).

A list's digest, for the cluster's index (COMPAT-10), is rolling: ``d(0)`` is empty and
``d(k) = blake2b-128(d(k-1) ‖ canonical(k))``, so the digests of every prefix of a request's
input cost one encoding and one hash per item, and a context keeps its own digest as it grows
(``Rolling``), paying only for new items.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import msgspec

from protocol.items import (
    Compaction,
    ContentPart,
    CustomToolCall,
    CustomToolCallOutput,
    FunctionCall,
    FunctionCallOutput,
    InputFile,
    InputImage,
    InputItem,
    InputText,
    Message,
    OpaqueItem,
    OutputText,
    Reasoning,
    Refusal,
)

DIGEST_SIZE = 16  # 128 bits: a collision between two of one key's lists is not a concern
_encode = msgspec.msgpack.Encoder().encode
_json = msgspec.json.Encoder(order="sorted").encode


def _parts(content: str | list[ContentPart]) -> tuple[Any, ...]:
    if isinstance(content, str):
        return (("t", content),)
    out: list[Any] = []
    for part in content:
        if isinstance(part, InputText | OutputText):
            out.append(("t", part.text))
        elif isinstance(part, Refusal):
            out.append(("r", part.refusal))
        elif isinstance(part, InputImage):
            out.append(("i", part.detail, part.image_url, part.file_id))
        elif isinstance(part, InputFile):
            out.append(("f", part.file_id, part.file_data, part.file_url, part.filename))
    return tuple(out)


def canonical(item: InputItem) -> bytes:
    """The item's canonical form (see the module docstring), as bytes."""
    form: tuple[Any, ...]
    if isinstance(item, Message):
        form = ("m", item.role, item.phase, _parts(item.content))
    elif isinstance(item, FunctionCall):
        form = ("c", item.call_id, item.name, item.namespace, item.arguments)
    elif isinstance(item, FunctionCallOutput):
        form = ("o", item.call_id, _parts(item.output))
    elif isinstance(item, CustomToolCall):
        form = ("cc", item.call_id, item.name, item.namespace, item.input)
    elif isinstance(item, CustomToolCallOutput):
        form = ("co", item.call_id, _parts(item.output))
    elif isinstance(item, Reasoning):
        summary = tuple(part.text for part in item.summary or ())
        content = tuple(part.text for part in item.content or ())
        form = ("rs", summary, content, item.encrypted_content)
    elif isinstance(item, Compaction):
        form = ("x", item.encrypted_content)
    elif isinstance(item, OpaqueItem):
        body = {k: v for k, v in item.data.items() if k not in ("id", "status")}
        form = ("op", _json(body))
    else:  # an item reference: never in a context (resolved when it enters), so never equal
        form = ("ref", item.id)
    return _encode(form)


def item_digest(item: InputItem) -> bytes:
    """One item's own digest: of its canonical form."""
    return hashlib.blake2b(canonical(item), digest_size=DIGEST_SIZE).digest()


def holds(held: list[InputItem], sent: list[InputItem], length: int) -> bool:
    """``sent[:length]`` is ``held[:length]``, item for item in canonical form (COMPAT-8).

    Equal items are equal in canonical form (their fields are; an ``OpaqueItem``'s JSON is
    compared by value, which ``1`` and ``1.0`` pass, so it is never taken as equal by ``==``
    alone): the lists are compared in C first, and only an item that differs, as a resend in
    the SDK's shapes does (ids dropped, a string for one text part), is compared canonically."""
    if len(held) < length or len(sent) < length:
        return False
    if held[:length] == sent[:length] and OpaqueItem not in set(map(type, sent[:length])):
        return True
    return all(
        (a == b and type(a) is not OpaqueItem) or canonical(a) == canonical(b)
        for a, b in zip(held[:length], sent[:length], strict=True)
    )


def step(digest: bytes, item: InputItem) -> bytes:
    """The digest of a list one item longer."""
    return hashlib.blake2b(digest + canonical(item), digest_size=DIGEST_SIZE).digest()


def prefix_digests(items: list[InputItem]) -> list[bytes]:
    """``d(1)`` … ``d(len(items))``: the digest of every non-empty prefix of ``items``."""
    out: list[bytes] = []
    digest = b""
    for item in items:
        digest = step(digest, item)
        out.append(digest)
    return out


@dataclass(frozen=True, slots=True)
class Rolling:
    """A context's digest so far: of its first ``covered`` items."""

    covered: int = 0
    digest: bytes = b""

    def over(self, items: list[InputItem]) -> Rolling:
        """The digest of all of ``items``, of which the first ``covered`` were digested."""
        if self.covered > len(items):  # the list was replaced (a compaction): start again
            return Rolling().over(items)
        digest = self.digest
        for item in items[self.covered :]:
            digest = step(digest, item)
        return Rolling(len(items), digest)


NO_DIGEST = Rolling()  # shared by every new context: it is immutable

# What a remembered input costs beyond its bytes and the items it decoded (MEM-10): per item,
# a slot in each of its four lists, its texts' list object and its two counts (ints past 256);
# once, the two bytes objects' and four lists' headers, the spare room of the three lists grown
# by appends (about 40 bytes each) and itself (80). tests/engine/test_resend_footprint.py
# measures it: it was 354 once and 160 an item, 9% under what a one-item input holds.
SENT_ITEM_OVERHEAD = 4 * 8 + 64 + 2 * 28
SENT_OVERHEAD = 2 * 33 + 4 * 56 + 3 * 40 + 80


@dataclass(slots=True)
class Sent:
    """A create's ``input`` as it came over HTTP, and what it was decoded to (COMPAT-7).

    A client that keeps its own history re-serializes the same items to the same bytes every
    turn, so a resend's first items are, byte for byte, the input of the request before it:
    items whose bytes equal an accepted request's are that request's items (decoding is a
    function of the bytes), so they are taken from here, never decoded, converted, sized or
    scanned again. ``joined``: the raw items joined by commas (each one JSON value, so the
    split is unique); ``last``: the last one's bytes, where the cache files it; ``chars[i]``:
    the readable characters of ``items[:i]`` (LEN's limit); ``cost[i]``: the bytes of
    ``items[:i]`` that no context holds (set when published, MEM-10)."""

    joined: bytes
    last: bytes
    items: list[InputItem]
    texts: list[list[str]]
    chars: list[int]
    cost: list[int]

    @property
    def nbytes(self) -> int:
        """What remembering it costs (charged with its cache entry, HYD-2)."""
        own = len(self.joined) + len(self.last) + len(self.items) * SENT_ITEM_OVERHEAD
        return SENT_OVERHEAD + own + self.cost[-1]


def sent(
    raws: list[Any], items: list[InputItem], texts: list[list[str]], held: Held | None
) -> Sent:
    """The record of an input whose raw items are ``raws`` (the first ``held.length`` of them
    taken from ``held.sent``)."""
    start = held.length if held is not None else 0
    chars = held.sent.chars[: start + 1] if held is not None else [0]
    total = chars[-1]
    for readable in texts[start:]:
        for text in readable:
            total += len(text)
        chars.append(total)
    cost = held.sent.cost[: start + 1] if held is not None else [0]
    return Sent(b",".join(raws), bytes(raws[-1]), items, texts, chars, cost)


@dataclass(frozen=True, slots=True)
class Held:
    """A create's first ``length`` raw items equal ``sent``'s first ``length``, byte for byte."""

    sent: Sent
    length: int
