"""The aiohttp application factory (SPEC: HTTP-1, WS-1)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable

from aiohttp import WSCloseCode, web

from engine.core import Engine, EngineConfig
from engine.server import http
from engine.server.keys import ENGINE, MAX_FRAME, SESSIONS
from engine.server.ws import serve_socket
from engine.session import Session
from protocol.errors import HttpStatusError, InvalidRequest, ProtocolError, ServerError

log = logging.getLogger("rollout.server")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MAX_BODY_BYTES = 32 * 1024 * 1024


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure leaves as the JSON error envelope; internal text never does (ERR-3)."""
    try:
        return await handler(request)
    except ProtocolError as err:
        return http.error_response(err)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return http.error_response(_http_error(exc))
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return http.error_response(ServerError())


_HTTP_ERRORS = {
    404: ("not_found", "No such endpoint."),
    405: ("method_not_allowed", "Method not allowed on this path."),
    413: ("request_too_large", "The request body is too large."),
}


def _http_error(exc: web.HTTPException) -> ProtocolError:
    """aiohttp's own rejections, in our envelope and with their real status (ERR-2)."""
    code, message = _HTTP_ERRORS.get(exc.status, ("invalid_request", "Invalid request."))
    return HttpStatusError(exc.status, code, message)


async def responses_get(request: web.Request) -> web.StreamResponse:
    """``GET /v1/responses`` is the WebSocket endpoint (WS-1)."""
    if request.headers.get("Upgrade", "").lower() != "websocket":
        raise InvalidRequest(
            "websocket_upgrade_required",
            "GET /v1/responses opens a WebSocket; use POST /v1/responses for HTTP.",
            None,
        )
    engine: Engine = request.app[ENGINE]
    return await serve_socket(request, engine, request.app[MAX_FRAME])


async def _start(app: web.Application) -> None:
    await app[ENGINE].start()


async def _close_sockets(app: web.Application) -> None:
    sessions: set[Session] = app[SESSIONS]
    for session in list(sessions):
        sink = session.sink
        ws = getattr(sink, "_ws", None)
        if ws is not None:
            with contextlib.suppress(Exception):
                await ws.close(code=WSCloseCode.GOING_AWAY, message=b"server shutdown")
        await session.close()


async def _stop(app: web.Application) -> None:
    await app[ENGINE].stop()


def create_app(
    engine: Engine | None = None, *, max_frame_bytes: int = MAX_BODY_BYTES
) -> web.Application:
    app = web.Application(middlewares=[errors], client_max_size=max_frame_bytes)
    app[ENGINE] = engine or Engine(EngineConfig())
    app[SESSIONS] = set()
    app[MAX_FRAME] = max_frame_bytes
    app.router.add_get("/v1/responses", responses_get)
    app.router.add_post("/v1/responses", http.create_response)
    app.router.add_get("/v1/responses/{response_id}", http.get_response)
    app.router.add_delete("/v1/responses/{response_id}", http.delete_response)
    app.router.add_post("/v1/responses/{response_id}/cancel", http.cancel_response)
    app.router.add_get("/v1/responses/{response_id}/input_items", http.list_input_items)
    app.router.add_get("/v1/models", http.list_models)
    app.router.add_get("/healthz", http.healthz)
    app.router.add_get("/debug/stats", http.stats)
    app.router.add_get("/metrics", http.metrics)
    app.on_startup.append(_start)
    app.on_shutdown.append(_close_sockets)
    app.on_cleanup.append(_stop)
    return app
