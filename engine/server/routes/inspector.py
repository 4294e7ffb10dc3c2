"""The live inspector: ``GET /inspect`` (the page) and ``GET /inspect/feed`` (its WebSocket
feed) (SPEC: INSP-1..INSP-8).

Glue only: the data comes from ``engine.inspector.read_model.Inspector``. One sampler task per
server
samples at ``TICK_S`` while at least one viewer is connected, and encodes each snapshot once
for every viewer. Each viewer has its own sender that always sends the newest snapshot, so a
slow browser skips snapshots instead of queueing them or slowing the others (INSP-3).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any
from urllib.parse import urlsplit

import msgspec
from aiohttp import WSCloseCode, WSMsgType, web

from engine.inspector.page import LOGIN_PAGE, PAGE
from engine.inspector.read_model import ErrorLogHandler, Inspector
from engine.inspector.signins import SignIns
from engine.server.transport import identity
from engine.server.transport.keys import INSPECTOR, SERVER
from engine.store.framing import ANY_OWNER, OwnerFilter
from protocol.errors import HttpStatusError, Unavailable

log = logging.getLogger("rollout.inspect")
PAGE_PATH, FEED_PATH = "/inspect", "/inspect/feed"
LOGIN_PATH, LOGOUT_PATH = "/inspect/login", "/inspect/logout"
INSPECT_PATHS = frozenset({PAGE_PATH, FEED_PATH})
COOKIE = "rollout_inspect_session"  # a session token, never a key (AUTH-14)
TICK_S = 0.5  # 2 Hz (INSP-3)
MAX_REQUEST_BYTES = 4096  # the page sends only small requests ({"type":"turns",...})
_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode
# The page needs nothing from elsewhere: inline script and style, its own feed, no framing.
_CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; img-src data:; frame-ancestors 'none'; base-uri 'none'"
)


def browser_key(request: web.Request) -> str | None:
    """The API key behind the session a browser presents on the inspector paths, where it
    cannot send a bearer header on a WebSocket: the page's cookie holds a session token set by
    the login form, mapped to its key here (INSP-2, AUTH-13, AUTH-14). Never a query string: a
    key in a URL ends up in logs and history."""
    token = request.cookies.get(COOKIE)
    if request.path not in INSPECT_PATHS or token is None:
        return None
    return request.app[SIGN_INS].key_of(token)


def login_form(request: web.Request, status: int = 401) -> web.Response:
    """What a browser without the inspector's cookie gets on ``/inspect`` of a keyed server: a
    form that posts the key in the body (AUTH-13)."""
    retry = "" if status == 401 and request.method == "GET" else "<p>That key was refused.</p>"
    return web.Response(
        status=status,
        text=LOGIN_PAGE.replace("{retry}", retry),
        content_type="text/html",
        headers={"Cache-Control": "no-store", "Content-Security-Policy": _CSP},
    )


async def login(request: web.Request) -> web.StreamResponse:
    """``POST /inspect/login`` (AUTH-13, AUTH-14): the key arrives in the form body, never in
    the URL, from a page of this origin only; a valid one opens a session whose random token
    becomes the HttpOnly cookie scoped to the inspector, and the browser is sent to the page."""
    _signed_in_here(request)
    config = request.app[SERVER]
    form = await request.post()
    key = form.get("key")
    if not isinstance(key, str) or not config.key_allowed(key.strip()):
        return login_form(request)
    moved = web.HTTPSeeOther(location=PAGE_PATH)
    token = request.app[SIGN_INS].open(key.strip())
    moved.set_cookie(
        COOKIE,
        token,
        path=PAGE_PATH,
        max_age=int(config.inspector_session_ttl_s),
        secure=request.secure,  # under TLS the cookie never travels in clear (AUTH-14)
        httponly=True,
        samesite="Strict",
    )
    raise moved


async def logout(request: web.Request) -> web.StreamResponse:
    """``POST /inspect/logout`` (AUTH-14): the cookie's session is revoked on the server, the
    cookie dropped, and the browser sent to the login form."""
    _signed_in_here(request)
    token = request.cookies.get(COOKIE)
    if token is not None:
        request.app[SIGN_INS].close(token)
    moved = web.HTTPSeeOther(location=PAGE_PATH)
    moved.del_cookie(COOKIE, path=PAGE_PATH)
    raise moved


class Feed:
    """The one sampler and its viewers. The sampler runs only while someone watches. Each
    viewer has a scope (INSP-9): everything, or one owner's rollouts; a tick samples and
    encodes once per scope being watched, whatever the number of viewers."""

    def __init__(self, inspector: Inspector, interval: float = TICK_S) -> None:
        self.inspector = inspector
        self.interval = interval
        self.viewers: dict[web.WebSocketResponse, OwnerFilter] = {}
        self.latest: dict[OwnerFilter, str] = {}
        self.version = 0
        self._tick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def join(self, ws: web.WebSocketResponse, scope: OwnerFilter = ANY_OWNER) -> None:
        self.viewers[ws] = scope
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._sample_while_watched(), name="inspect-feed")

    def leave(self, ws: web.WebSocketResponse) -> None:
        self.viewers.pop(ws, None)  # the sampler notices at its next tick and stops

    async def _sample_while_watched(self) -> None:
        try:
            while self.viewers:
                self._publish(self.inspector.sample_for(self.viewers.values()))
                await asyncio.sleep(self.interval)
        except Exception:
            log.exception("inspector sampler failed")
            for ws in list(self.viewers):
                await ws.close(code=WSCloseCode.INTERNAL_ERROR, message=b"sampler failed")
        finally:
            self.inspector.pause()

    def _publish(self, snapshots: dict[OwnerFilter, dict[str, Any]]) -> None:
        # once per scope, whatever the number of viewers
        self.latest = {scope: _encode(snap).decode() for scope, snap in snapshots.items()}
        self.version += 1
        tick, self._tick = self._tick, asyncio.Event()
        tick.set()

    async def newest(self, seen: int, scope: OwnerFilter = ANY_OWNER) -> tuple[int, str]:
        """The newest snapshot of ``scope`` after version ``seen`` (waits for the next tick if
        needed, or for the first one sampled for this scope)."""
        while self.version <= seen or scope not in self.latest:
            await self._tick.wait()
        return self.version, self.latest[scope]

    async def close(self) -> None:
        """Server shutdown: stop sampling and close every viewer (1001, going away)."""
        for ws in list(self.viewers):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ws.close(code=WSCloseCode.GOING_AWAY, message=b""), 1)
        self.viewers.clear()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None


FEED = web.AppKey("inspect_feed", Feed)
SIGN_INS = web.AppKey("inspect_sign_ins", SignIns)
LOG_HANDLER = web.AppKey("inspect_log_handler", ErrorLogHandler)


async def page(request: web.Request) -> web.StreamResponse:
    """The page (the auth middleware has checked the cookie on a keyed server, INSP-2)."""
    return web.Response(
        text=PAGE,
        content_type="text/html",
        headers={"Cache-Control": "no-store", "Content-Security-Policy": _CSP},
    )


async def feed(request: web.Request) -> web.StreamResponse:
    """The feed: snapshots out at each tick, turn-history requests in (INSP-3, INSP-5)."""
    _same_origin(request)
    hub = request.app[FEED]
    limit = request.app[SERVER].max_inspector_viewers
    if len(hub.viewers) >= limit:  # each viewer costs a sender and a socket buffer (LIM-23)
        raise Unavailable(
            "too_many_viewers", f"The inspector accepts at most {limit} viewers at once.", None
        )
    # Uncompressed: deflating every snapshot would cost more CPU than the sampling, and a send
    # cancelled mid-deflate (a viewer leaving) leaves aiohttp's shielded write unretrieved.
    scope = await viewer_scope(request)
    ws = web.WebSocketResponse(max_msg_size=MAX_REQUEST_BYTES, heartbeat=None, compress=False)
    await ws.prepare(request)
    hub.join(ws, scope)
    sender = asyncio.create_task(_send_snapshots(ws, hub, scope), name="inspect-viewer")
    try:
        async for msg in ws:
            if msg.type is WSMsgType.TEXT:
                with contextlib.suppress(ConnectionError, RuntimeError):  # the viewer left
                    await ws.send_str(_answer(hub.inspector, msg.data, scope))
    finally:
        hub.leave(ws)
        sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)
    return ws


async def viewer_scope(request: web.Request) -> OwnerFilter:
    """What this viewer may see (INSP-9): everything on an open server or with an operator key
    (AUTH-4), else only its own key's connections and rollouts."""
    if not request.app[SERVER].keyed or identity.is_admin(request):
        return ANY_OWNER
    return await identity.owner(request)


async def _send_snapshots(ws: web.WebSocketResponse, hub: Feed, scope: OwnerFilter) -> None:
    seen = 0
    with contextlib.suppress(ConnectionError, RuntimeError):
        while not ws.closed:
            seen, data = await hub.newest(seen, scope)
            await ws.send_str(data)


def _answer(inspector: Inspector, raw: str, scope: OwnerFilter) -> str:
    """One request from the page: ``{"type":"turns","rollout_id":…}``."""
    try:
        request = _decode(raw)
        rollout_id = request["rollout_id"] if request.get("type") == "turns" else None
    except (msgspec.DecodeError, AttributeError, KeyError):
        rollout_id = None
    if not isinstance(rollout_id, str):
        hint = {"type": "error", "message": "expected {type: turns, rollout_id: <id>}"}
        return _encode(hint).decode()
    return _encode(inspector.turns(rollout_id, scope)).decode()


def _same_origin(request: web.Request) -> None:
    """A page on another site must not open this feed with the operator's cookie (INSP-2)."""
    origin = request.headers.get("Origin")
    if origin is not None and urlsplit(origin).netloc != request.host:
        raise HttpStatusError(
            403, "cross_origin_feed", "The inspector feed accepts only its own page's origin."
        )


def _signed_in_here(request: web.Request) -> None:
    """A sign-in or sign-out comes from the inspector's own page (AUTH-13): an ``Origin`` of
    this host, or, without one, ``Sec-Fetch-Site: same-origin``. No evidence is a refusal, so
    neither another site nor a client that hides where it posts from signs a browser in."""
    origin = request.headers.get("Origin")
    if origin is None:
        same = request.headers.get("Sec-Fetch-Site") == "same-origin"
    else:
        same = urlsplit(origin).netloc == request.host
    if not same:
        raise HttpStatusError(
            403, "cross_origin_login", "The inspector signs in from its own page only."
        )


# --------------------------------------------------------------------------- app wiring


def install(app: web.Application) -> None:
    """Routes and lifecycle of the inspector on the app that owns ``INSPECTOR``."""
    app.router.add_get(PAGE_PATH, page)
    app.router.add_post(LOGIN_PATH, login)
    app.router.add_post(LOGOUT_PATH, logout)
    app.router.add_get(FEED_PATH, feed)
    app[FEED] = Feed(app[INSPECTOR])
    config = app[SERVER]
    app[SIGN_INS] = SignIns(config.inspector_session_ttl_s, config.max_inspector_sessions)
    app[LOG_HANDLER] = ErrorLogHandler(app[INSPECTOR].errors)
    app.on_startup.append(_start)
    app.on_shutdown.append(_stop_feed)
    app.on_cleanup.append(_detach_log)


async def _start(app: web.Application) -> None:
    logging.getLogger("rollout").addHandler(app[LOG_HANDLER])


async def _stop_feed(app: web.Application) -> None:
    await app[FEED].close()


async def _detach_log(app: web.Application) -> None:
    logging.getLogger("rollout").removeHandler(app[LOG_HANDLER])
