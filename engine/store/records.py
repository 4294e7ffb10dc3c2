"""The response store interface: flat records chained by parent pointers (SPEC: STORE-1..STORE-20).

A stored response holds its own new input items, its output (in the Response) and the context
items it added, plus a pointer to its nearest stored ancestor. It never copies the whole history,
so a turn writes O(new items). To keep hydration cheap for long chains, every
``SNAPSHOT_EVERY``-th record of a chain holds the full context (a *snapshot*) and every record
lists the ids between it and its snapshot (``links``, at most ``SNAPSHOT_EVERY - 1``): hydrating
is one read of the record and one batched read of its links (STORE-5).

Backends (memory, SQLite, Redis, Postgres) implement the primitives (``_write``, ``_read``,
``_replace``, ``_remove``, ``_ping``; ``_read_one`` and ``_read_chain`` where one backend
query does better than the default); encoding, size limits, corrupt-record handling,
availability tracking and chain walking live here, once. What the processes sharing a store
tell each other (idempotency keys, parked addresses, counters, notices, the node token) is not
a record concern: it is the store's ``cluster`` port (``engine/store/cluster_state.py``).
"""

from __future__ import annotations

import abc
import collections
import logging
import secrets
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import ClassVar, TypeVar

import msgspec

from engine.store.cluster_state import ClusterState
from engine.store.framing import ANY_OWNER, MAGIC, OwnerFilter, head_line, peek, readable_by
from engine.store.owner import SALT_BYTES, digest
from engine.store.record_codec import RecordCodec
from engine.store.trajectory import TokenSegment, joined
from protocol.items import InputItem
from protocol.response import Response

log = logging.getLogger("rollout.store")

RECORD_VERSION = 1  # bumped when the record layout changes; readers reject unknown versions
SNAPSHOT_EVERY = 16  # a chain stores a full-context snapshot at least every this many records
DEFAULT_TTL_S = 30 * 24 * 3600.0  # --store-ttl (STORE-7)
DEFAULT_MAX_RECORD_BYTES = 64 * 1024 * 1024  # one encoded record (STORE-9)
DEFAULT_MAX_ENTRIES = 10_000  # records kept by memory:// (LIM-5)
# Records live ttl + 1%: a chain then extends its links' expiry at most once per 1% of the TTL
# (7.2 h of 30 days), not on every write (STORE-7).
SLACK_FRACTION = 0.01


class StoreError(Exception):
    """Base of the store's failures; never put on the wire as is."""


class StoreUnavailable(StoreError):
    """The store cannot be reached or did not acknowledge (503 ``store_unavailable``, STORE-8)."""


class RecordTooLarge(StoreError):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"record of {size} bytes exceeds the {limit}-byte limit")
        self.size = size
        self.limit = limit


class RecordCorrupt(StoreError):
    """A stored record cannot be decoded (STORE-9)."""

    def __init__(self, response_id: str) -> None:
        super().__init__(f"stored record {response_id} cannot be decoded")
        self.response_id = response_id


class ChainPoint(msgspec.Struct, frozen=True):
    """Where a context stands in the store: its first ``length`` items are exactly what
    ``hydrate(response_id)`` returns. Carried by a rollout's context so the next stored turn
    writes only the items after ``length``."""

    response_id: str
    length: int
    links: tuple[str, ...]  # ids of the records before ``response_id``, snapshot first
    expires_at: float | None = None  # none of these records expires before (None: never)


class ResponseRecord(msgspec.Struct, kw_only=True):
    """One stored response (STORE-4)."""

    response: Response  # status, output and the settings it ran with (model, instructions, tools…)
    input_items: list[InputItem]  # this request's own input items, listing form (STORE-3)
    context: list[InputItem]  # context items added since ``parent_id`` (all of them: a snapshot)
    parent_id: str | None  # nearest stored ancestor whose context ours extends
    links: list[str]  # records whose ``context`` precede ours, snapshot first; [] = a snapshot
    owner: str | None = None  # who may read it (an API key fingerprint); None = anyone
    created_at: float = 0.0  # unix seconds
    length: int = 0  # items in the whole context after this response
    expires_at: float | None = None  # set by ``put``: unix seconds, None = never (STORE-7)
    links_expire_at: float | None = None  # none of ``links`` expires before (None: never)
    deleted: bool = False  # a tombstone: invisible, kept only as a link of later records
    version: int = RECORD_VERSION
    tokens: TokenSegment | None = None  # the ``tokens`` backend's trajectory part (TOK-8)

    @property
    def id(self) -> str:
        return self.response.id

    @property
    def snapshot(self) -> bool:
        return not self.links

    @property
    def point(self) -> ChainPoint:
        """The chain point after this response (once stored)."""
        return ChainPoint(self.id, self.length, tuple(self.links), _earliest(self))


@dataclass(slots=True)
class Hydrated:
    """A stored response and the whole conversation context after it."""

    record: ResponseRecord
    items: list[InputItem]
    point: ChainPoint
    tokens: list[TokenSegment] | None = None  # the whole token trajectory, when stored (TOK-8)


def chain_record(
    response: Response,
    input_items: list[InputItem],
    context: Sequence[InputItem],
    parent: ChainPoint | None,
    *,
    owner: str | None = None,
    every: int = SNAPSHOT_EVERY,
) -> ResponseRecord:
    """The record for ``response`` whose full context is ``context``, given the chain point the
    context extends (None: it extends nothing stored). Its ``point`` is valid once stored."""
    if parent is not None and parent.length <= len(context) and len(parent.links) + 1 < every:
        links = [*parent.links, parent.response_id]
        added = list(context[parent.length :])
        links_expire_at = parent.expires_at
    else:
        links, added = [], list(context)  # a snapshot: no stored ancestor, or the chain is long
        links_expire_at = None
    return ResponseRecord(
        response=response,
        input_items=input_items,
        context=added,
        parent_id=parent.response_id if parent is not None else None,
        links=links,
        owner=owner,
        created_at=time.time(),
        length=len(context),
        links_expire_at=links_expire_at,
    )


def _earliest(record: ResponseRecord) -> float | None:
    if record.expires_at is None or not record.links:
        return record.expires_at
    if record.links_expire_at is None:
        return record.expires_at
    return min(record.expires_at, record.links_expire_at)


_CODEC = RecordCodec(ResponseRecord)
_ENCODER, _DECODER = _CODEC, _CODEC  # encode(record) -> bytes, decode(bytes) -> record

T = TypeVar("T")


class ResponseStore(abc.ABC):
    """The records. What the engine (and the hydration cache) use; ``cluster`` is the
    cluster-state port beside them (idempotency keys, parking, counters, notices, node token).
    Every method may raise ``StoreUnavailable``; ``get``/``hydrate`` may raise
    ``RecordCorrupt``; ``put`` may raise ``RecordTooLarge``. ``put`` returns only once the
    record is durable (STORE-6)."""

    kind: ClassVar[str]
    reads_prefixes: ClassVar[bool] = False  # ``_read_head`` may return only a blob's start
    cluster_state: ClassVar[type[ClusterState]] = ClusterState  # this backend's port

    def __init__(
        self, ttl_s: float = DEFAULT_TTL_S, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    ) -> None:
        self.ttl_s = ttl_s  # 0 = keep forever
        self.max_record_bytes = max_record_bytes
        self.available = True  # last known state, no I/O: True until an operation fails
        self.counters: collections.Counter[str] = collections.Counter()  # events (OBS-2)
        self._salt: bytes | None = None  # the owner digests' salt, read once (OWN-6)
        self.cluster = self.cluster_state(self)

    @property
    def held_bytes(self) -> int:
        """The bytes this process holds for the records (MEM-15): 0 where they live elsewhere."""
        return 0

    # ------------------------------------------------------------------ backend primitives
    @abc.abstractmethod
    async def _write(
        self, key: str, blob: bytes, links: Sequence[str], refresh: bool, expires_at: float | None
    ) -> None:
        """Store ``blob`` durably under ``key`` until ``expires_at``; with ``refresh``, extend
        the expiry of ``links`` (the records its context needs) to at least that (STORE-7)."""

    @abc.abstractmethod
    async def _read(self, keys: Sequence[str]) -> list[bytes | None]:
        """The blobs of ``keys`` in order, None for missing or expired ones, in one round trip."""

    async def _read_one(self, key: str) -> bytes | None:
        """One blob; backends with a cheaper single read override it."""
        (blob,) = await self._read([key])
        return blob

    async def _read_chain(self, key: str) -> tuple[bytes, dict[str, bytes | None] | None] | None:
        """A record's blob and, where one query can fetch them with it, the blobs of the
        records it links by id (a missing id: gone); None for the links means "read them
        next" (one batched ``_read``). None when the record itself is missing."""
        blob = await self._read_one(key)
        return None if blob is None else (blob, None)

    async def _read_head(self, key: str) -> bytes | None:
        """At least the first ``MAX_HEAD`` bytes of a blob (its head line, STORE-20); backends
        that can read a prefix override it and set ``reads_prefixes``."""
        return await self._read_one(key)

    async def _load_salt(self, fresh: bytes) -> bytes:
        """The store's owner salt: the one already kept, else ``fresh``, now kept (OWN-6). A
        backend that keeps nothing across instances (memory) keeps it per instance."""
        return fresh

    @abc.abstractmethod
    async def _scan(self, cursor: str, limit: int) -> tuple[list[tuple[str, bytes]], str | None]:
        """Up to ``limit`` live keys from ``cursor`` ("" = the start) with their first
        ``MAX_HEAD`` bytes, and the next cursor (None: done). SQL and memory backends go in
        id order; Redis by its ``SCAN`` cursor, which may repeat a key (EXPORT-2)."""

    @abc.abstractmethod
    async def _replace(self, key: str, blob: bytes) -> None:
        """Overwrite an existing ``key`` keeping its expiry (nothing if it has gone)."""

    @abc.abstractmethod
    async def _remove(self, key: str) -> bool: ...

    @abc.abstractmethod
    async def _ping(self) -> None: ...

    async def _guard(self, op: Awaitable[T]) -> T:
        """Track availability: a failure marks the store down, the next success up again."""
        try:
            result = await op
        except StoreUnavailable:
            if self.available:
                log.warning("store (%s) unavailable", self.kind)
            self.available = False
            raise
        if not self.available:
            log.info("store (%s) available again", self.kind)
        self.available = True
        return result

    # ------------------------------------------------------------------ lifecycle
    async def open(self) -> None:
        """Connect / create the schema. A store that is down at start is not fatal (STORE-8)."""
        return None

    async def close(self) -> None:
        """Finish queued writes and release connections."""
        return None

    # ------------------------------------------------------------------ the interface
    async def put(self, record: ResponseRecord) -> None:
        """Sets the record's expiry; extends its links' expiry only when one of them could
        expire before ``ttl`` from now (at most once per slack period and chain, STORE-7)."""
        refresh = False
        if self.ttl_s > 0:
            now = time.time()
            record.expires_at = now + self.ttl_s * (1 + SLACK_FRACTION)
            known = record.links_expire_at
            if record.links and (known is None or known < now + self.ttl_s):
                refresh, record.links_expire_at = True, record.expires_at
        else:
            record.expires_at = record.links_expire_at = None
        blob = _encode(record)
        if len(blob) > self.max_record_bytes:
            raise RecordTooLarge(len(blob), self.max_record_bytes)
        await self._guard(self._write(record.id, blob, record.links, refresh, record.expires_at))

    async def get(self, response_id: str, owner: OwnerFilter = ANY_OWNER) -> ResponseRecord | None:
        """The live record, or None: missing, expired, deleted, or not ``owner``'s. The owner
        check reads only the record's head line, so a corrupt record of another owner is None
        too; ``RecordCorrupt`` reaches only a reader who may see it (OWN-5, STORE-9)."""
        blob = await self._guard(self._read_one(response_id))
        head = None if blob is None else peek(blob)
        if blob is None or not readable_by(head, owner) or (head is not None and head.deleted):
            return None
        record = _decode(response_id, blob)
        return None if record.deleted else record

    async def exists(self, response_id: str) -> bool:
        """Stored, unexpired and not deleted, from the record's head line alone: what a cached
        context needs confirmed before it is served (HYD-5). Raises ``RecordCorrupt`` for a
        blob that is not a record."""
        blob = await self._guard(self._read_head(response_id))
        if self.reads_prefixes and blob is not None and blob[:1] == b"{":
            blob = await self._guard(self._read_one(response_id))  # no head line: all of it
        if blob is None:
            return False
        head = peek(blob)
        if head is None:
            raise RecordCorrupt(response_id)
        return not head.deleted

    async def owner_of(self, api_key: str) -> str:
        """The owner digest of ``api_key`` in this store (OWN-1, OWN-6): keyed with the store's
        own salt, so digests of one deployment say nothing about another's."""
        return digest(await self._owner_salt(), api_key)

    async def _owner_salt(self) -> bytes:
        """The owner salt, read once (OWN-6); the cluster port keys node tokens with it."""
        if self._salt is None:
            self._salt = await self._guard(self._load_salt(secrets.token_bytes(SALT_BYTES)))
        return self._salt

    async def hydrate(self, response_id: str, owner: OwnerFilter = ANY_OWNER) -> Hydrated | None:
        """The record and its whole context: one read, then one batched read of its links (on
        Postgres one query for both, STORE-15). None when it, or a record its context needs,
        is gone (deleted or expired), or when it is not ``owner``'s (checked as ``get`` does,
        from the head line, before any decode)."""
        found = await self._guard(self._read_chain(response_id))
        if found is None:
            return None
        first, prefetched = found
        head = peek(first)
        if not readable_by(head, owner) or (head is not None and head.deleted):
            return None
        record = _decode(response_id, first)
        if record.deleted:
            return None
        chain: list[ResponseRecord] = []
        if record.links:
            if prefetched is None:
                blobs = await self._guard(self._read(record.links))
            else:
                blobs = [prefetched.get(link) for link in record.links]
            for link, blob in zip(record.links, blobs, strict=True):
                if blob is None:
                    log.info("store: %s needs %s, which is gone", response_id, link)
                    return None
                chain.append(_decode(link, blob))  # tombstones included (STORE-11)
            if not chain[0].snapshot:
                raise RecordCorrupt(response_id)
        chain.append(record)
        items = [item for part in chain for item in part.context]
        if len(items) != record.length:
            raise RecordCorrupt(response_id)
        tokens = joined([part.tokens for part in chain])
        if tokens is not None and tokens[-1].covered != record.length:
            tokens = None
        return Hydrated(record, items, record.point, tokens)

    async def owned_ids(
        self, owner: OwnerFilter, cursor: str, limit: int
    ) -> tuple[list[str], str | None]:
        """One page of the live records ``owner`` may read (EXPORT-2), judged by head lines
        alone (nothing is decoded), and the cursor of the next page (None: no more). ``cursor``
        "" starts; a page may hold fewer than ``limit`` ids (others' records are skipped).
        Callers read each id back owner-checked (``hydrate``), as every id route does."""
        heads, after = await self._guard(self._scan(cursor, limit))
        ids = []
        for key, blob in heads:
            if blob[:1] == b"{":  # a record from before head lines: its owner is in the body
                ids.append(key)  # so the caller's owner-checked read decides (hydrate)
                continue
            head = peek(blob)
            if readable_by(head, owner) and not (head is not None and head.deleted):
                ids.append(key)
        return ids, after

    async def delete(self, response_id: str, owner: OwnerFilter = ANY_OWNER) -> bool:
        """The response is gone for every reader; its context items stay, as a tombstone, only
        while later records link it (until its expiry, STORE-7), so the responses continued
        from it can still be continued (STORE-11). A corrupt record is removed outright. Only a
        record ``owner`` may see is touched (OWN-5): another's is left alone, as if unknown."""
        blob = await self._guard(self._read_one(response_id))
        head = None if blob is None else peek(blob)
        if blob is not None and not readable_by(head, owner):
            return False
        removed = False
        if blob is not None and (head is None or not head.deleted):
            removed = await self._retire(response_id, blob)
        self.cluster.notify_deleted(
            response_id
        )  # caches drop it even if this process never stored it
        return removed

    async def _retire(self, response_id: str, blob: bytes) -> bool:
        """A live record becomes a tombstone; a corrupt one is removed. False if it already
        was a tombstone (a record from before head lines says so only in its body)."""
        try:
            record = _decode(response_id, blob)
        except RecordCorrupt:
            await self._guard(self._remove(response_id))
            return True
        if record.deleted:
            return False
        tombstone = msgspec.structs.replace(
            record,
            response=msgspec.structs.replace(record.response, output=[]),
            input_items=[],
            deleted=True,
        )
        await self._guard(self._replace(response_id, _encode(tombstone)))
        return True

    async def health(self) -> bool:
        """Reachable now? Updates ``available``."""
        try:
            await self._guard(self._ping())
        except StoreUnavailable:
            return False
        return True

    def count_into(self, counters: collections.Counter[str]) -> None:
        """Count the store's events (``store.*``) in ``counters`` from now on: the engine's,
        which ``/metrics`` and ``/debug/stats`` read (OBS-2)."""
        counters.update(self.counters)
        self.counters = counters

    def count(self, event: str) -> None:
        """One store event; on the event loop only (the counters are read there)."""
        self.counters[event] += 1


def _encode(record: ResponseRecord) -> bytes:
    """The head line (owner, tombstone flag) and the JSON body (STORE-20)."""
    return head_line(record.owner, record.deleted) + _ENCODER.encode(record)


def _decode(response_id: str, blob: bytes) -> ResponseRecord:
    head = peek(blob) if blob[: len(MAGIC)] == MAGIC else None
    body = memoryview(blob)[head.body_at :] if head is not None else blob
    try:
        record: ResponseRecord = _DECODER.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError, TypeError, AttributeError):
        log.warning("store: record %s cannot be decoded (%d bytes)", response_id, len(blob))
        raise RecordCorrupt(response_id) from None
    if record.version != RECORD_VERSION or record.id != response_id:
        raise RecordCorrupt(response_id)
    if head is not None and (head.owner, head.deleted) != (record.owner, record.deleted):
        raise RecordCorrupt(response_id)  # a head that disagrees with its body
    return record
