"""The aiohttp application: its middlewares (the error envelope, API keys), its lifecycle
(start, drain, stop) and its routes, each resource's registered by its own module (SPEC:
HTTP-1, WS-1, ERR-2, AUTH-2, LIM-13)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable

from aiohttp import WSCloseCode, web

from engine.connection.background import BackgroundRuns
from engine.connection.session import Session
from engine.core import Engine, EngineConfig
from engine.inspector.read_model import Inspector
from engine.server.routes import cluster, conversations, inspector, ops, v1_responses
from engine.server.transport import codex_headers, http, idempotency, ratelimits, turn_state
from engine.server.transport import node as nodes
from engine.server.transport.identity import PRESENTED
from engine.server.transport.keys import (
    BACKGROUND,
    DRAINING,
    ENGINE,
    INSPECTOR,
    MAX_FRAME,
    REQUESTS,
    SERVER,
    SESSIONS,
    UNREADY,
)
from engine.server.transport.server_config import ServerConfig
from engine.server.transport.ws import WsSink
from protocol.errors import (
    HttpStatusError,
    ProtocolError,
    ServerError,
    Unauthorized,
)

log = logging.getLogger("rollout.server")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure leaves as the JSON error envelope; internal text never does (ERR-3). The
    API key is checked first, inside it (``authenticate``, AUTH-2): one middleware a request,
    not two."""
    try:
        refused = authenticate(request)
        response = await handler(request) if refused is None else refused
    except ProtocolError as err:
        response = http.error_response(err)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        response = http.error_response(_http_error(exc))
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        response = http.error_response(ServerError())
    if response.status >= 400:
        http.note_error(request, response)  # the inspector's recent errors (INSP-6)
    if response.status >= 500 and not response.prepared:
        _mark_retry(response)
    return response


def _mark_retry(response: web.StreamResponse) -> None:
    """Tell the openai SDK (``x-should-retry``, which it obeys before its own status rules)
    whether running the request again is safe: a 503 is sent only for a request that did no
    work (RETRY-1); any other 5xx may follow work, so it is never retried (RETRY-2)."""
    if "x-should-retry" not in response.headers:
        response.headers["x-should-retry"] = "true" if response.status == 503 else "false"


_HTTP_ERRORS = {
    404: ("not_found", "No such endpoint."),
    405: ("method_not_allowed", "Method not allowed on this path."),
    413: ("request_too_large", "The request body is too large."),
}


def _http_error(exc: web.HTTPException) -> ProtocolError:
    """aiohttp's own rejections, in our envelope and with their real status (ERR-2)."""
    code, message = _HTTP_ERRORS.get(exc.status, ("invalid_request", "Invalid request."))
    return HttpStatusError(exc.status, code, message)


def authenticate(request: web.Request) -> web.StreamResponse | None:
    """Bearer API keys, checked before any work and before a WebSocket upgrade (AUTH-2): raises
    the refusal, or returns the inspector's login form a browser is answered with instead; None
    lets the request through."""
    config = request.app[SERVER]
    if config.keyed and request.path not in _OPEN_PATHS:
        scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer":
            key: str | None = presented.strip()
        else:  # the inspector's page and feed also take their cookie (INSP-2, AUTH-13)
            key = inspector.browser_key(request)
        if key is None or not config.key_allowed(key):
            if request.path == inspector.PAGE_PATH and request.method == "GET":
                return inspector.login_form(request)  # a browser signs in with a form
            raise Unauthorized("invalid_api_key", _key_hint(request.path), None)
        if request.path in OPERATOR_PATHS and not config.is_admin(key):
            raise HttpStatusError(
                403,
                "operator_key_required",
                "This endpoint answers operator keys only (--admin-keys-file).",
            )  # every tenant's figures (AUTH-11)
        request[PRESENTED] = key  # who the request is, for every route after (OWN-1)
    return None


def _key_hint(path: str) -> str:
    if path in inspector.INSPECT_PATHS:
        return "Incorrect or missing API key (sign in at /inspect)."
    return "Incorrect or missing API key (use Authorization: Bearer)."


# The node-to-node routes are opened by a node token instead of an API key (PARK-22, LIVE-2);
# the login form checks the key it is posted itself (AUTH-13), sign-out revokes the cookie's
# session whatever it is (AUTH-14).
_OPEN_PATHS = frozenset(
    {
        "/healthz",
        *nodes.NODE_PATHS,
        inspector.LOGIN_PATH,
        inspector.LOGOUT_PATH,
    }
)
# What shows every tenant's figures: only an operator key reads it on a keyed server (AUTH-11).
OPERATOR_PATHS = frozenset({"/metrics", "/debug/stats", "/v1/bench/timings"})


def _answer_headers(
    engine: Engine, config: ServerConfig
) -> Callable[[web.Request, web.StreamResponse], Awaitable[None]]:
    """The headers every answer may carry, stamped before they leave by one
    ``on_response_prepare`` hook (one coroutine an answer, not one per header family): a node
    route's version (LIVE-10), the turn-state token (TURN-2), ``x-ratelimit-*`` where limits
    are configured (RATE-3; the configuration is fixed for the app's life), Codex's headers
    (CODEX-21)."""
    turn = turn_state.stamper(engine, config.node_id or turn_state.default_node_id())
    limited = config.rate_limited

    async def stamp(request: web.Request, response: web.StreamResponse) -> None:
        nodes.say_version(request, response)
        turn(request, response)
        if limited:
            await ratelimits.add_headers(request, response)
        codex_headers.stamp(request, response)

    return stamp


async def _start(app: web.Application) -> None:
    engine = app[ENGINE]
    engine.store.cluster.on_delete(lambda response_id: _forget(app, response_id))
    await engine.start()


def _forget(app: web.Application, response_id: str) -> None:
    """A deleted response leaves every connection's cache too (STORE-11)."""
    for session in app[SESSIONS]:
        session.forget(response_id)


async def _drain_sockets(app: web.Application) -> None:
    """Graceful shutdown (LIM-13): refuse new work, let in-flight responses finish within the
    grace period, closing each socket with 1001 (going away) as soon as it is idle (DRAIN-3),
    so its client reconnects to another node at once instead of waiting for the busiest one."""
    app[DRAINING][0] = True
    app[ENGINE].parking.drain()  # nothing resumes here any more; the store serves them (PARK-10)
    sessions: set[Session] = app[SESSIONS]
    for session in sessions:
        session.draining = True
    loop = asyncio.get_running_loop()
    deadline = loop.time() + app[SERVER].shutdown_grace_s
    runs, closed = app[BACKGROUND], set[Session]()
    while True:
        for session in [s for s in sessions if s not in closed and not s.busy]:
            closed.add(session)
            await _close_draining(session)
        if not (sessions - closed or runs.busy) or loop.time() >= deadline:
            break
        # A bounded poll, once, at shutdown: simpler than wiring idle events through every lane.
        await asyncio.sleep(0.05)
    await runs.close()  # background runs still going are cancelled (BG-6)
    for session in list(sessions - closed):
        await _close_draining(session)


async def _close_draining(session: Session) -> None:
    if isinstance(session.sink, WsSink):
        await session.sink.close(WSCloseCode.GOING_AWAY, b"shutdown")
    await session.close()


async def _stop(app: web.Application) -> None:
    await app[ENGINE].stop()


def create_app(
    engine: Engine | None = None,
    *,
    max_frame_bytes: int | None = None,
    server: ServerConfig | None = None,
) -> web.Application:
    config = server or ServerConfig()
    if max_frame_bytes is not None:
        config = dataclasses.replace(config, max_frame_bytes=max_frame_bytes)
    app = web.Application(middlewares=[errors], client_max_size=config.max_frame_bytes)
    app[ENGINE] = engine or Engine(EngineConfig())
    app[SESSIONS] = set()
    app[REQUESTS] = set()
    app[MAX_FRAME] = config.max_frame_bytes
    app[SERVER] = config
    app[DRAINING] = [False]
    app[UNREADY] = [False]
    app[BACKGROUND] = BackgroundRuns(app[ENGINE])
    app[idempotency.PENDING] = {}
    v1_responses.register(app)  # /v1/responses… (HTTP-1..HTTP-9, WS-1)
    ops.register(app)  # /healthz, /v1/models, /metrics, /debug/stats (DRAIN-1, OBS-1)
    conversations.register(app)  # /v1/conversations… (CONV-1..CONV-4)
    sessions, requests, runs = app[SESSIONS], app[REQUESTS], app[BACKGROUND]
    app[INSPECTOR] = Inspector(app[ENGINE], [lambda: sessions, lambda: requests, runs.sessions])
    inspector.install(app)
    nodes.install(app)  # the client peers are asked with, the version answers say (LIVE-10)
    cluster.install(app)  # hand-over (PARK-21), runs (LIVE-2), repeats (LIVE-8) from any node
    app.on_response_prepare.append(_answer_headers(app[ENGINE], config))
    app.on_startup.append(_start)
    app.on_shutdown.append(_drain_sockets)
    app.on_cleanup.append(_stop)
    return app
