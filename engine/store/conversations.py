"""Conversations: items appended per response, beside the response records (SPEC: CONV-1..CONV-10).

A conversation is a *head* record under its id (``conv_…``) and its items in *segments*, one
per append (``conv_…:N``), so a response's end writes only its own new items and a head of a few
hundred bytes (CONV-8). Every blob starts with the head line of the conversation's owner with
the tombstone flag set (STORE-20): the owner is checked from that line before any body is
decoded (OWN-5), and no response route ever reads, lists or deletes one (as idempotency keys,
IDEM-3).

The head also says which stored response's context stands for the conversation's first
``covered`` items (CONV-6): a create on the conversation continues from that response through
the one loader (its lane cache, the hydration cache or the store, with its token trajectory),
and only the items after ``covered`` are new to it.

Writers hold the conversation's lock (``conv_…:lock``, claimed atomically in the store, so it
holds across every node sharing it, CONV-7): a create from admission to its response's end,
and each item route for its one write.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec

from engine.store.framing import MAGIC, OwnerFilter, head_line, peek, readable_by
from engine.store.listing import listing_form
from engine.store.record_codec import decode_items, encode_items
from engine.store.records import SLACK_FRACTION, RecordCorrupt, RecordTooLarge, ResponseStore
from protocol.items import InputItem, OpaqueItem
from protocol.stream import new_id

VERSION = 1
MAX_ITEMS = 10_000  # items one conversation holds (CONV-9, LIM-…)
MAX_ITEMS_PER_REQUEST = 20  # items one create or items request adds (CONV-9), as OpenAI's
MAX_SEGMENTS = 32  # segments before an append merges them into one (CONV-8)
LOCK_S = 600.0  # a lock outlives a node that died holding it by at most this (CONV-7)
_ID = re.compile(r"conv_[0-9a-f]{32}")


class ConversationError(Exception):
    """Base of the conversation faults the routes map to wire errors."""


class ConversationLocked(ConversationError):
    """Another request is writing to it (409 ``conversation_locked``, CONV-7)."""


class ConversationFull(ConversationError):
    """It holds ``MAX_ITEMS`` items or the store's record bound in bytes (CONV-9)."""


class ConversationHead(msgspec.Struct, kw_only=True):
    """The conversation record: what a route returns, and where its items are."""

    id: str
    created_at: int
    metadata: dict[str, str] = msgspec.field(default_factory=dict)
    segments: list[str] = msgspec.field(default_factory=list)  # segment keys, oldest first
    counts: list[int] = msgspec.field(default_factory=list)  # items in each segment
    nbytes: int = 0  # encoded bytes of all segments (CONV-9)
    next_segment: int = 0
    response_id: str | None = None  # whose stored context holds the first ``covered`` items
    covered: int = 0
    segments_expire_at: float | None = None  # no segment expires before (None: never)
    version: int = VERSION

    @property
    def count(self) -> int:
        return sum(self.counts)


_ENCODE = msgspec.json.Encoder().encode
_DECODE = msgspec.json.Decoder(ConversationHead).decode


def valid_id(conversation_id: str) -> bool:
    """Ids this server made; anything else is unknown without a read (CONV-2)."""
    return _ID.fullmatch(conversation_id) is not None


def with_id(item: InputItem) -> InputItem:
    """How an item is kept: the listing form, with an id for every kind (CONV-3)."""
    item = listing_form(item)
    if isinstance(item, OpaqueItem) and item.id is None:
        return OpaqueItem({**item.data, "id": new_id("item")})
    return item


@dataclass
class Lock:
    """A held conversation lock; ``release`` is safe to call more than once. It frees the lock
    only while the store still holds this claim's token (CONV-7): one that lapsed and was
    claimed by another writer stays that writer's."""

    conversations: Conversations
    key: str
    token: bytes
    held: bool = True

    async def release(self) -> None:
        if self.held:
            self.held = False
            await self.conversations.store.cluster.release(self.key, self.token)


@dataclass
class Opened:
    """A conversation read for a write under its lock: its head and owner."""

    head: ConversationHead
    owner: str | None
    lock: Lock
    pending: list[InputItem] = field(default_factory=list)  # items after ``covered`` (CONV-6)


class Conversations:
    """The conversation records of one store; stateless beyond it, so made where needed."""

    def __init__(self, store: ResponseStore, lock_s: float = LOCK_S) -> None:
        self.store = store
        self.lock_s = lock_s  # how long a lock it takes holds (CONV-7); tests shorten it

    # ------------------------------------------------------------------ reads
    async def head(self, conversation_id: str, owner: OwnerFilter) -> ConversationHead | None:
        """The head, or None: unknown, expired, deleted, or not ``owner``'s (from the head
        line, before any decode, OWN-5)."""
        if not valid_id(conversation_id):
            return None
        blob = await self.store._guard(self.store._read_one(conversation_id))
        return self._decode_head(conversation_id, blob, owner)

    async def items(self, head: ConversationHead, after: int = 0) -> list[InputItem]:
        """Its items from the ``after``-th on, oldest first: one batched read of the segments
        that hold them."""
        skip, keys = after, list[str]()
        for key, count in zip(head.segments, head.counts, strict=True):
            if not keys and skip >= count:
                skip -= count
                continue
            keys.append(key)
        if not keys:
            return []
        blobs = await self.store._guard(self.store._read(keys))
        items: list[InputItem] = []
        for key, blob in zip(keys, blobs, strict=True):
            items.extend(self._decode_segment(key, blob))
        return items[skip:]

    # ------------------------------------------------------------------ writes
    async def create(
        self, owner: str | None, metadata: dict[str, str], items: Sequence[InputItem]
    ) -> ConversationHead:
        head = ConversationHead(id=new_id("conv"), created_at=int(time.time()), metadata=metadata)
        kept = [with_id(item) for item in items]
        if kept:
            await self._add_segment(head, owner, kept)  # a new head replaces nothing
        await self._write_head(head, owner)
        return head

    async def open(self, conversation_id: str, owner: OwnerFilter) -> Opened | None:
        """Lock it and read its head (None: unknown or another's, and nothing is held).
        Raises ``ConversationLocked`` while another writer holds it (CONV-7)."""
        if await self.head(conversation_id, owner) is None:
            return None  # another's conversation is never locked by this request (OWN-2)
        key = conversation_id + ":lock"
        token = head_line(None, True) + secrets.token_hex(8).encode()
        held = await self.store.cluster.claim(key, token, time.time() + self.lock_s)
        if held is not None:
            raise ConversationLocked
        lock = Lock(self, key, token)
        try:
            blob = await self.store._guard(self.store._read_one(conversation_id))
            head = self._decode_head(conversation_id, blob, owner)
            if head is None:  # deleted meanwhile
                await lock.release()
                return None
        except BaseException:
            await lock.release()
            raise
        found = peek(blob) if blob is not None else None
        return Opened(head, found.owner if found is not None else None, lock)

    async def append(
        self, opened: Opened, items: Sequence[InputItem], response_id: str | None = None
    ) -> list[InputItem]:
        """Add ``items`` (one segment) under the held lock, and return them as kept (with their
        ids, CONV-3). ``response_id``: a stored response whose context is now the whole
        conversation (CONV-6)."""
        head = opened.head
        kept = [with_id(item) for item in items]
        stale = await self._add_segment(head, opened.owner, kept) if kept else []
        if response_id is not None:
            head.response_id, head.covered = response_id, head.count
        await self._write_head(head, opened.owner)
        for key in stale:  # merged into the new segment; the head names them no more
            await self.store._guard(self.store._remove(key))
        return kept

    def check_room(self, opened: Opened, adding: int) -> None:
        head = opened.head
        if head.count + adding > MAX_ITEMS or head.nbytes >= self.store.max_record_bytes:
            raise ConversationFull

    async def update(self, opened: Opened, metadata: dict[str, str]) -> ConversationHead:
        opened.head.metadata = metadata
        await self._write_head(opened.head, opened.owner)
        return opened.head

    async def delete_item(self, opened: Opened, item_id: str) -> bool:
        """Remove one item: its segment is rewritten. The conversation's model context is then
        no longer a stored response's (CONV-6): the next create renders all of it afresh."""
        head = opened.head
        blobs = await self.store._guard(self.store._read(head.segments))
        for index, (key, blob) in enumerate(zip(head.segments, blobs, strict=True)):
            items = self._decode_segment(key, blob)
            kept = [item for item in items if getattr(item, "id", None) != item_id]
            if len(kept) == len(items):
                continue
            body = encode_items(kept)
            await self._put(key, opened.owner, body, head.segments_expire_at)
            head.counts[index] = len(kept)
            head.nbytes += len(body) - (len(blob or b"") - _head_size(blob))
            head.response_id, head.covered = None, 0
            await self._write_head(head, opened.owner)
            return True
        return False

    async def delete(self, opened: Opened) -> None:
        """Gone for every reader: the head first, then its segments (CONV-4)."""
        await self.store._guard(self.store._remove(opened.head.id))
        for key in opened.head.segments:
            await self.store._guard(self.store._remove(key))

    # ------------------------------------------------------------------ internals
    async def _add_segment(
        self, head: ConversationHead, owner: str | None, items: list[InputItem]
    ) -> list[str]:
        """Write ``items`` as a new segment and name it in ``head`` (not yet written). Past
        ``MAX_SEGMENTS`` the segment holds all the items instead, while that stays well within
        the record bound; the segments it replaces are returned, to be removed once the head
        no longer names them."""
        body = encode_items(items)
        old: list[str] = []
        if len(head.segments) >= MAX_SEGMENTS and head.nbytes + len(body) < self._merge_below:
            body = encode_items([*await self.items(head), *items])
            items_count = head.count + len(items)
            old, head.segments, head.counts, head.nbytes = head.segments, [], [], 0
        else:
            items_count = len(items)
        key = f"{head.id}:{head.next_segment}"
        head.next_segment += 1
        await self._put(key, owner, body, self._expiry())
        head.segments.append(key)
        head.counts.append(items_count)
        head.nbytes += len(body)
        return old

    @property
    def _merge_below(self) -> int:
        return self.store.max_record_bytes // 2

    async def _write_head(self, head: ConversationHead, owner: str | None) -> None:
        """The head, with its segments' expiry extended when one could lapse first (STORE-7)."""
        expires_at = self._expiry()
        now = time.time()
        known = head.segments_expire_at
        ttl = self.store.ttl_s
        refresh = bool(head.segments) and ttl > 0 and (known is None or known < now + ttl)
        if refresh or ttl <= 0:
            head.segments_expire_at = expires_at
        blob = head_line(owner, True) + _ENCODE(head)
        write = self.store._write(head.id, blob, head.segments, refresh, expires_at)
        await self.store._guard(write)

    async def _put(self, key: str, owner: str | None, body: bytes, expires: float | None) -> None:
        blob = head_line(owner, True) + body
        if len(blob) > self.store.max_record_bytes:  # as a response's record (STORE-9)
            raise RecordTooLarge(len(blob), self.store.max_record_bytes)
        await self.store._guard(self.store._write(key, blob, (), False, expires))

    def _expiry(self) -> float | None:
        ttl = self.store.ttl_s
        return time.time() + ttl * (1 + SLACK_FRACTION) if ttl > 0 else None

    def _decode_head(
        self, key: str, blob: bytes | None, owner: OwnerFilter
    ) -> ConversationHead | None:
        if blob is None or blob[: len(MAGIC)] != MAGIC:
            return None  # not a conversation blob (nothing this module wrote)
        found = peek(blob)
        if found is None or not readable_by(found, owner):
            return None
        try:
            head = _DECODE(memoryview(blob)[found.body_at :])
        except (msgspec.DecodeError, msgspec.ValidationError):
            raise RecordCorrupt(key) from None
        if head.id != key or head.version != VERSION:
            raise RecordCorrupt(key)
        return head

    def _decode_segment(self, key: str, blob: bytes | None) -> list[InputItem]:
        found = None if blob is None else peek(blob)
        if blob is None or found is None:
            raise RecordCorrupt(key)  # a segment its head names is gone or not one
        try:
            return decode_items(bytes(memoryview(blob)[found.body_at :]))
        except (msgspec.DecodeError, msgspec.ValidationError):
            raise RecordCorrupt(key) from None


def _head_size(blob: bytes | None) -> int:
    found = None if blob is None else peek(blob)
    return 0 if found is None else found.body_at


@dataclass
class Joined:
    """A response's place in its conversation (CONV-5): its items are appended when it ends
    (completed or incomplete), and the conversation's lock is released either way."""

    conversations: Conversations
    opened: Opened
    own: list[InputItem]  # the request's own input items (not the pending ones, CONV-6)

    async def finish(
        self,
        status: str,
        output: Sequence[InputItem],
        stored_as: str | None,
        then: list[InputItem] | None = None,
    ) -> Joined | None:
        """``stored_as``: the id of the stored response whose context is now the whole
        conversation, or None (``store: false``): the head stays where it was (CONV-6).
        ``then``: the input of a response that continues this one in the same rollout (a
        steered response's successor, STEER-3), which then holds the lock in its turn."""
        try:
            if status in ("completed", "incomplete"):
                # Read again: a response that outlived LOCK_S may have lost the lock to another
                # writer meanwhile, whose items this append must keep (CONV-7).
                fresh = await self.conversations.head(self.opened.head.id, self.opened.owner)
                if fresh is not None:  # else deleted meanwhile: nothing to append to
                    self.opened.head = fresh
                    items = [*self.own, *output]
                    await self.conversations.append(self.opened, items, stored_as)
        except BaseException:
            await self.opened.lock.release()
            raise
        if then is None:
            await self.opened.lock.release()
            return None
        return Joined(self.conversations, self.opened, then)
