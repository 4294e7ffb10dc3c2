"""``Idempotency-Key`` on ``POST /v1/responses`` (SPEC: IDEM-1..IDEM-6): a request sent again
with the same key, by the same API key, within the key's lifetime, is answered with the first
request's answer and runs (and bills) nothing.

The key's entry lives in the shared response store (IDEM-3), so a retry that a client or a
balancer sends to another node finds it too. The first request claims the key atomically and
stores ``running``; once answered it stores the answer (status, content type, body; for SSE the
bytes of the whole stream). A request that did no work releases the key, so its retry runs.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import msgspec
from aiohttp import web

from engine.server.transport import identity
from engine.server.transport.keys import ENGINE, SERVER
from engine.server.transport.node import IDEM_FOLLOW_PATH, NODES, RunRequest
from engine.server.transport.server_config import ServerConfig
from engine.store import StoreError
from engine.store.failures import wire_error
from protocol.codec import http_error_body
from protocol.errors import HttpStatusError, InvalidRequest, ProtocolError, ServerError

log = logging.getLogger("rollout.server")

HEADER = "Idempotency-Key"
REPLAYED = "Idempotent-Replayed"  # Stripe's name for the header on a replayed answer
MAX_KEY_CHARS = 255
RUNNING, DONE = "running", "done"


class Entry(msgspec.Struct, omit_defaults=True):
    """What the store keeps under one key (IDEM-3)."""

    fingerprint: str  # sha256 of the request body: a different body is another request
    state: str  # RUNNING or DONE
    at: float  # unix seconds: claimed (RUNNING) or answered (DONE)
    status: int = 0
    content_type: str = ""
    body: bytes = b""  # the JSON answer, or every SSE frame sent, in order
    node: str = ""  # RUNNING: the address of the node running it, for repeats (LIVE-8)


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(Entry).decode


@dataclass(slots=True)
class Tap:
    """What the create handler reports back: whether work started (the response opened, so the
    model may have run: the answer is kept, never run again) and, for SSE, the frames sent."""

    started: bool = False
    frames: list[bytes] = field(default_factory=list)
    frame_bytes: int = 0
    closed: bool = False
    _waiters: list[asyncio.Future[None]] = field(default_factory=list)

    def frame(self, data: bytes) -> None:
        self.frames.append(data)
        self.frame_bytes += len(data)
        self._wake()

    def close(self) -> None:
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def follow(self) -> AsyncIterator[bytes]:
        """Every frame sent so far, then each as it is sent, until the request ends (LIVE-8):
        a repeat follows the first one's stream live, nothing run again."""
        sent = 0
        while True:
            while sent < len(self.frames):
                yield self.frames[sent]
                sent += 1
            if self.closed:
                return
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter


Create = Callable[[Tap], Awaitable[web.StreamResponse]]
# Requests with a key claimed by this process and not answered yet: a repeat here follows the
# first one's stream, or waits for its answer (IDEM-4, LIVE-8). Bounded by the requests in flight.
Pending = dict[str, tuple[asyncio.Future[Entry], Tap]]
PENDING = web.AppKey("idempotent_pending", Pending)


async def once(request: web.Request, key: str, body: bytes, create: Create) -> web.StreamResponse:
    """Run ``create`` at most once per (API key, ``key``) for the key's lifetime (IDEM-2)."""
    _check(key)
    config: ServerConfig = request.app[SERVER]
    store = request.app[ENGINE].store
    owner = await identity.owner(request)
    scope = f"{owner or '-'}:{hashlib.sha256(key.encode()).hexdigest()}"
    fingerprint = hashlib.sha256(body).hexdigest()
    node = request.app[ENGINE].handover.address or ""  # where repeats follow it (LIVE-8)
    claim = _encode(Entry(fingerprint, RUNNING, time.time(), node=node))
    try:
        held = await store.cluster.claim_key(scope, claim, config.idempotency_ttl_s)
    except StoreError as exc:
        raise wire_error(exc) from None  # a 503 before any work: safe to send again (RETRY-1)
    if held is not None:
        return await _repeat(request, scope, _decode(held), fingerprint)
    pending: Pending = request.app[PENDING]
    answered: asyncio.Future[Entry] = asyncio.get_running_loop().create_future()
    tap, entry = Tap(), None
    pending[scope] = (answered, tap)
    try:
        response = await create(tap)
        entry = _answer(response, tap, fingerprint, config.idempotency_max_answer_bytes)
    except BaseException as exc:
        entry = _failure(exc, tap, fingerprint)
        raise
    finally:
        tap.close()
        del pending[scope]
        await _settle(request, scope, claim, entry, answered)
    return response


def _check(key: str) -> None:
    if not key or len(key) > MAX_KEY_CHARS or not key.isascii() or not key.isprintable():
        raise InvalidRequest(
            "invalid_idempotency_key",
            f"{HEADER} must be 1 to {MAX_KEY_CHARS} printable ASCII characters.",
            None,
        )


def _answer(response: web.StreamResponse, tap: Tap, fingerprint: str, limit: int) -> Entry | None:
    """The entry that answers repeats, or None: the request did no work, its key is released
    (IDEM-3). Work started, or any 5xx but a 503 (RETRY-1, RETRY-2): the answer is kept."""
    status = response.status
    if status >= 400 and not tap.started and (status < 500 or status == 503):
        return None
    if isinstance(response, web.Response) and not response.prepared:
        raw = response.body
        body = raw if isinstance(raw, bytes) else b""
        content_type = response.content_type
    else:  # an SSE stream, already sent: its frames
        body, content_type = b"".join(tap.frames), "text/event-stream"
    if len(body) > limit:
        log.warning("idempotent answer of %d bytes not kept (limit %d)", len(body), limit)
        status, content_type, body = 500, "application/json", _TOO_LARGE
    return Entry(fingerprint, DONE, time.time(), status, content_type, body)


_TOO_LARGE = msgspec.json.encode(
    {
        "error": {
            "type": "server_error",
            "code": "idempotent_answer_too_large",
            "message": "The first request with this Idempotency-Key ran, but its answer was "
            "too large to keep for repeats.",
            "param": None,
        }
    }
)


def _failure(exc: BaseException, tap: Tap, fingerprint: str) -> Entry | None:
    """A create that raised: a refusal before any work releases the key; after work began,
    repeats get a 500 (never run again, RETRY-2)."""
    refused = isinstance(exc, ProtocolError) and (exc.status < 500 or exc.status == 503)
    if refused and not tap.started:
        return None
    body = http_error_body(ServerError())
    return Entry(fingerprint, DONE, time.time(), 500, "application/json", body)


async def _settle(
    request: web.Request,
    scope: str,
    claim: bytes,
    entry: Entry | None,
    answered: asyncio.Future[Entry],
) -> None:
    """Store the outcome (or release the key, if ``claim`` still holds it), then wake the
    repeats waiting here. A store that fails now leaves the key ``running``: repeats are
    refused (IDEM-4), never run."""
    store, ttl = request.app[ENGINE].store, request.app[SERVER].idempotency_ttl_s
    try:
        if entry is None:
            await store.cluster.release_key(scope, claim)
        else:
            await store.cluster.settle_key(scope, _encode(entry), ttl)
    except StoreError as exc:
        log.warning("idempotency key not settled: %s", exc)
    if entry is None:
        answered.set_exception(_RELEASED)
        answered.exception()  # retrieved: nobody may be waiting
    else:
        answered.set_result(entry)


class _Released(Exception):
    """The first request did no work and released its key."""


_RELEASED = _Released()


async def _repeat(
    request: web.Request, scope: str, entry: Entry, fingerprint: str
) -> web.StreamResponse:
    """A request whose key is held: the first answer, or the wait for it (IDEM-4, IDEM-5)."""
    if entry.fingerprint != fingerprint:
        raise HttpStatusError(
            422,
            "idempotency_key_reused",
            f"This {HEADER} was used with a different request body; use a new key.",
        )
    if entry.state == RUNNING:
        first = request.app[PENDING].get(scope)
        if first is None and entry.node:  # running on another node: follow it there (LIVE-8)
            asked = RunRequest(scope, kind="idem")
            relayed = await request.app[NODES].relay(request, entry.node, IDEM_FOLLOW_PATH, asked)
            if relayed is not None:
                return relayed
        if first is None:  # running on another node (or its node died before it answered)
            raise HttpStatusError(
                409,
                "idempotency_key_in_use",
                f"A request with this {HEADER} is still running; retry later.",
            )
        answered, tap = first
        if tap.frames:  # the first one streams: follow it live (LIVE-8)
            return await _follow(request, tap)
        try:
            entry = await asyncio.shield(answered)
        except _Released:
            raise HttpStatusError(
                409, "idempotency_key_in_use", f"Retry the request with this {HEADER}."
            ) from None
    return await _replay(request, entry)


async def _follow(request: web.Request, tap: Tap) -> web.StreamResponse:
    stream = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", REPLAYED: "true"}
    )
    await stream.prepare(request)
    try:
        async for data in tap.follow():
            await stream.write(data)
    except ConnectionError:
        return stream  # the repeat left; the first one runs on
    await stream.write_eof()
    return stream


async def follow_here(request: web.Request, scope: str) -> web.StreamResponse | None:
    """Another node's repeat of a request this node runs follows it here (LIVE-8): its stream
    live, or its answer once answered; None when it is not running here (answered meanwhile:
    the repeat reads the settled entry)."""
    first = request.app[PENDING].get(scope)
    if first is None:
        return None
    answered, tap = first
    if tap.frames:
        return await _follow(request, tap)
    try:
        entry = await asyncio.shield(answered)
    except _Released:
        return None
    return await _replay(request, entry)


async def _replay(request: web.Request, entry: Entry) -> web.StreamResponse:
    headers = {REPLAYED: "true"}
    if entry.status >= 500:
        headers["x-should-retry"] = "false"  # the first one ran (RETRY-2)
    if entry.content_type != "text/event-stream":
        return web.Response(
            body=entry.body, status=entry.status, content_type=entry.content_type, headers=headers
        )
    stream = web.StreamResponse(
        status=entry.status,
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **headers},
    )
    await stream.prepare(request)
    await stream.write(entry.body)
    await stream.write_eof()
    return stream
