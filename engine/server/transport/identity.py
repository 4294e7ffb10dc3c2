"""Who a request is (SPEC: AUTH-2, AUTH-4, OWN-1): the key the auth middleware accepted, the
owner digest it gives in this store, and whether it is an operator key. One place, used by
every route and the WebSocket driver."""

from __future__ import annotations

from aiohttp import web

from engine.server.transport.keys import ENGINE, SERVER
from engine.store import StoreError
from engine.store.failures import wire_error
from engine.store.framing import ANY_OWNER, OwnerFilter

PRESENTED = web.RequestKey("presented_key", str)  # set by the auth middleware once accepted
OWNER = web.RequestKey("owner_digest", str)  # set by ``owner`` once computed


def presented_key(request: web.Request) -> str | None:
    return request.get(PRESENTED)


async def owner(request: web.Request) -> str | None:
    """The owner digest of the request's key (OWN-1, OWN-6), or None on an open server, where
    everything is shared. The digest needs the store's salt: a store that cannot give it is
    ``store_unavailable``, once, until it answers (STORE-8)."""
    key = presented_key(request)
    if key is None or not request.app[SERVER].keyed:
        return None
    try:
        digest = await request.app[ENGINE].store.owner_of(key)
    except StoreError as exc:
        raise wire_error(exc) from None
    request[OWNER] = digest
    return digest


def known_owner(request: web.Request) -> OwnerFilter:
    """The owner ``owner`` found for this request; ANY_OWNER if none was (yet): on an open
    server, or before the key was read. For the inspector's recent errors (INSP-9)."""
    known: OwnerFilter = request.get(OWNER, ANY_OWNER)
    return known


def is_admin(request: web.Request) -> bool:
    """An operator key (AUTH-4); on an open server nobody needs to be one."""
    key = presented_key(request)
    return key is not None and request.app[SERVER].is_admin(key)
