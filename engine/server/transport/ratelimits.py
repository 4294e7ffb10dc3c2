"""Which limits a request or connection runs under, and the headers every answer carries
(SPEC: RATE-1, RATE-3, RATE-6). The counting itself is ``engine/retained/ratelimits.py``; the one
check is where creates are admitted (``connection/compat.py``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import cast

from aiohttp import web

from engine.retained.ratelimits import OPEN_BUCKET, Quota
from engine.server.transport import identity
from engine.server.transport.keys import ENGINE, SERVER
from protocol.errors import ProtocolError
from protocol.events import ServerEvent
from protocol.ratelimits import RateLimitSnapshot, codex_rate_limits

Send = Callable[[ServerEvent], Awaitable[None]]
QUOTA = web.RequestKey("quota", Quota)  # the request's or connection's quota, once built


async def quota_for(request: web.Request) -> Quota | None:
    """The quota of the request's key, or None when no limit applies to it (RATE-1): a server
    without limits counts nothing."""
    known: Quota | None = request.get(QUOTA)
    if known is not None:
        return known
    config = request.app[SERVER]
    if not config.rate_limited:
        return None
    key = identity.presented_key(request)
    if config.keyed and key is None:  # not (yet) a key: /healthz, a refused one
        return None
    limits = config.limits_for(key)
    if not limits.any:
        return None
    owner = await identity.owner(request)  # the counters' bucket: a digest, never the key
    store = request.app[ENGINE].store
    quota = Quota(store, owner or OPEN_BUCKET, limits, config.rate_window_s)
    request[QUOTA] = quota
    return quota


def codex_client(request: web.Request) -> bool:
    """Codex names itself in ``originator`` (``codex_cli_rs``, ``codex_exec``, …)."""
    return request.headers.get("originator", "").startswith("codex")


def tell_codex(quota: Quota, send: Send) -> None:
    """On Codex's WebSocket a refusal is preceded by ``codex.rate_limits`` (RATE-6), which
    Codex shows its user; other clients get only the error event (their SDKs know no such
    event type)."""

    async def refused(snapshot: RateLimitSnapshot) -> None:
        await send(cast(ServerEvent, codex_rate_limits(snapshot)))  # encoded like any event

    quota.on_refused = refused


async def add_headers(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: every answer to a limited key carries its ``x-ratelimit-*``
    figures (RATE-3), the WebSocket upgrade's included: those of its own admission when it
    made one, else the key's standing now."""
    if not request.app[SERVER].rate_limited:
        return
    try:
        quota = await quota_for(request)
    except ProtocolError:  # no owner without the store: the answer says so already
        return
    if quota is None:
        return
    snapshot = quota.last or await quota.current()
    if snapshot is not None:
        for name, value in snapshot.headers().items():
            response.headers.setdefault(name, value)
