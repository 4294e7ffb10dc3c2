"""Parked rollouts handed over between nodes (SPEC: PARK-20..PARK-22).

A balancer that spreads one key's connections (CLUSTER-10) sends a reconnect to any node, not
necessarily the one whose parking lot holds the rollout suspended behind the continued
response. So each node that parks a rollout registers its own address under the response id in
the shared store (PARK-20), for as long as it parks it. A node that gets a continuation it
cannot serve from memory or the store asks the store where that rollout is parked and requests
its context from that node (PARK-21): the parking node checks that the request comes from a
node sharing its store (an HMAC under the store's secret salt, PARK-22), claims the rollout for
the owner the request names (exactly as a reconnect of that owner would, OWN-2), retires it and
answers its items. The asking node then serves the continuation on a new rollout over those
items, ``store: false`` included: the items travel node to node, never through the store
(STORE-1).

This module is the asking side and the registrations; the answering side is the route in
``engine/server/routes/cluster.py`` (the one client and verifier:
``engine/server/transport/node.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable

import msgspec

from engine.store import ResponseStore, StoreError
from engine.store.record_codec import decode_items
from engine.store.trajectory import TokenSegment
from protocol.items import InputItem

log = logging.getLogger("rollout.handover")

HANDOVER_PATH = "/cluster/v1/handover"
TOKEN_HEADER = "x-rollout-node-token"
# The node-to-node protocol's version (LIVE-10): every request and every answer of a node route
# says which it speaks in VERSION_HEADER; none said is version 1 (the release before versions,
# commit 59cd6b8). A release that changes a node route's request or answer moves NODE_PROTOCOL
# up by one and keeps the previous version's formats: N accepts N-1, so a rolling upgrade never
# meets a peer it cannot read.
VERSION_HEADER = "x-rollout-node-protocol"
NODE_PROTOCOL = 2
NODE_PROTOCOL_ACCEPTED = range(NODE_PROTOCOL - 1, NODE_PROTOCOL + 1)
# Version 2's hand-over answer: MessagePack (the items as the records' JSON bytes, the token
# trajectory's ids and logprobs in binary); version 1's is JSON.
MSGPACK = "application/vnd.msgpack"
# Registrations in flight at once (PARK-20): a burst of closing sockets past this many skips
# the rest (counted), which costs those rollouts only their hand-over, never correctness.
MAX_PENDING = 256
HANDOVER_TIMEOUT_S = 5.0  # one node-to-node request, connect included (PARK-21)
# How long a continuation waits for the parking node to register a rollout it has not yet
# parked (its old socket's close not seen yet, or the registration still in flight), LIVE-5.
HANDOVER_WAIT_S = 2.0
HANDOVER_POLL_S = 0.05


# POST ``body`` with ``headers`` to a URL: (status, the answer's VERSION_HEADER or None, body).
# Raises OSError or TimeoutError when the node cannot be reached. The server gives it
# (engine/server/transport/node.py: only the server speaks HTTP); until then nothing
# is handed over.
Poster = Callable[[str, bytes, dict[str, str]], Awaitable[tuple[int, str | None, bytes]]]


class HandoverRequest(msgspec.Struct, forbid_unknown_fields=True):
    """The body of a hand-over request: which rollout, and for which owner (PARK-21)."""

    response_id: str
    owner: str | None = None


class HandoverAnswer(msgspec.Struct):
    """What the parking node answers (PARK-21) in version 1, JSON: the context's items as
    records hold them, and its model-token trajectory as one snapshot segment, if it has one
    (LIVE-4)."""

    items: msgspec.Raw
    tokens: TokenSegment | None = None


class PackedAnswer(msgspec.Struct, array_like=True):
    """The same in version 2, MessagePack (LIVE-10): the items' JSON bytes as one binary
    field, the trajectory's numbers in binary (about half the bytes of version 1's JSON)."""

    items: bytes
    tokens: TokenSegment | None = None


class Handed(msgspec.Struct):
    """A handed-over rollout's context, decoded."""

    items: list[InputItem]
    tokens: TokenSegment | None = None


_ANSWER = msgspec.json.Decoder(HandoverAnswer)
_PACKED = msgspec.msgpack.Decoder(PackedAnswer)


def spoken(header: str | None) -> int | None:
    """The version a peer's request or answer is in (LIVE-10): its ``VERSION_HEADER``; 1
    without one (a node of the release before versions); None when it is not a number."""
    if header is None:
        return 1
    return int(header) if header.isdigit() and len(header) < 6 else None


def answering(header: str | None) -> int | None:
    """The version to answer a request in (LIVE-10): the asker's, or this node's own when the
    asker's is newer (the asker reads N-1); None, refused, when it is older than this node
    still answers (or no version at all)."""
    asked = spoken(header)
    if asked is None or asked < NODE_PROTOCOL_ACCEPTED.start:
        return None
    return min(asked, NODE_PROTOCOL)


def readable(header: str | None) -> int | None:
    """The version of a peer's answer when this node reads it (LIVE-10), else None."""
    version = spoken(header)
    return version if version in NODE_PROTOCOL_ACCEPTED else None


def encode_answer(items: bytes, tokens: TokenSegment | None, version: int) -> tuple[bytes, str]:
    """The hand-over's answer in ``version``'s format: (body, content type)."""
    if version == 1:  # byte for byte what the release before versions sends
        return msgspec.json.encode(HandoverAnswer(msgspec.Raw(items), tokens)), "application/json"
    return msgspec.msgpack.encode(PackedAnswer(items, tokens)), MSGPACK


def decode_answer(body: bytes, version: int) -> Handed:
    """A hand-over's answer in ``version``'s format; raises ``msgspec.MsgspecError``."""
    if version == 1:
        answer = _ANSWER.decode(body)
        return Handed(decode_items(bytes(answer.items)), answer.tokens)
    packed = _PACKED.decode(body)
    return Handed(decode_items(packed.items), packed.tokens)


def token_message(response_id: str, owner: str | None, purpose: str = "handover") -> str:
    """What the node token signs: the purpose, the rollout or run and the owner, so a token
    opens nothing else (PARK-22, LIVE-2)."""
    return f"{purpose}\n{response_id}\n{owner or ''}"


class Handover:
    """One per engine. ``address`` is this node's base URL for its peers, set by the server
    once it listens; while it is None (one process, a worker pool) nothing is registered."""

    def __init__(self, store: ResponseStore, counters: Counter[str], seconds: float) -> None:
        self.store = store
        self.seconds = seconds
        self.address: str | None = None
        self._counters = counters
        self._pending: set[asyncio.Task[None]] = set()
        self.post: Poster | None = None

    @property
    def enabled(self) -> bool:
        return (
            self.address is not None and self.post is not None and self.store.cluster.shares_parking
        )

    def parked(self, response_id: str) -> None:
        """The lot parked a rollout behind ``response_id``: say where (PARK-20)."""
        if self.enabled:
            assert self.address is not None
            register = self.store.cluster.register_parked
            self.write_later(register(response_id, self.address, self.seconds))

    def unparked(self, response_id: str) -> None:
        """It left the lot (claimed, expired, retired): drop the address, sparing a hop."""
        if self.enabled:
            self.write_later(self.store.cluster.unregister_parked(response_id))

    def write_later(self, write: object) -> None:
        """Run a store write in the background, bounded (MAX_PENDING) and owned; a failure is
        counted and logged, never raised (a registration costs only its hand-over)."""
        assert asyncio.iscoroutine(write)
        if len(self._pending) >= MAX_PENDING:
            write.close()
            self._counters["park.register_skipped"] += 1
            return
        task = asyncio.create_task(self._quietly(write))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _quietly(self, write: object) -> None:
        assert asyncio.iscoroutine(write)
        try:
            await write
        except StoreError as exc:
            self._counters["park.register_failed"] += 1
            log.warning("store: parked rollout's address not kept: %s", exc)

    async def _where(self, response_id: str) -> str | None:
        """The node parking ``response_id``'s rollout. A reconnect may arrive before the old
        node saw its socket close (or wrote its address): wait for the address, polling,
        at most ``HANDOVER_WAIT_S`` (LIVE-5)."""
        loop = asyncio.get_running_loop()
        deadline, waited = loop.time() + HANDOVER_WAIT_S, False
        while True:
            where = await self.store.cluster.parked_at(response_id)
            if where is not None or loop.time() >= deadline:
                if waited and where is not None:
                    self._counters["park.handover_waited"] += 1
                return where
            waited = True
            await asyncio.sleep(HANDOVER_POLL_S)

    async def fetch(self, response_id: str, owner: str | None) -> Handed | None:
        """The context of the rollout another node parks behind ``response_id`` for ``owner``,
        now retired there (PARK-21), with its token trajectory (LIVE-4); None when no node
        parks it for that owner, or the node cannot be reached (the caller answers
        ``previous_response_not_found``)."""
        if not self.enabled:
            return None
        try:
            where = await self._where(response_id)
            if where is None or where == self.address:
                return None
            token = await self.store.cluster.node_token(token_message(response_id, owner))
        except StoreError as exc:
            log.warning("store: parked rollout's address unreadable: %s", exc)
            return None
        body = msgspec.json.encode(HandoverRequest(response_id, owner))
        headers = {
            TOKEN_HEADER: token,
            VERSION_HEADER: str(NODE_PROTOCOL),
            "Content-Type": "application/json",
        }
        assert self.post is not None
        try:
            status, version, answer = await self.post(where + HANDOVER_PATH, body, headers)
            read = readable(version)
            if read is None:  # a peer too old or too new, or its refusal of us (LIVE-10)
                self._counters["park.handover_unsupported"] += 1
                log.warning(
                    "hand-over of %s: %s speaks node protocol %s", response_id, where, version
                )
                return None
            if status != 200:
                self._counters["park.handover_missed"] += 1
                return None
            handed = decode_answer(answer, read)
        except (OSError, TimeoutError, msgspec.MsgspecError) as exc:
            self._counters["park.handover_failed"] += 1
            name = type(exc).__name__
            log.warning("hand-over of %s from %s failed: %s", response_id, where, name)
            return None
        self._counters["park.handover_received"] += 1
        return handed

    async def close(self) -> None:
        if self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)
