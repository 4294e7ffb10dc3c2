"""``/v1/responses`` and its ``{response_id}`` routes, in one place (HTTP-1..HTTP-9, WS-1):
create (JSON and SSE, detached with ``background``), compact, input tokens, the WebSocket
upgrade, retrieve, delete, cancel, input items and the token trajectory.

An HTTP create runs through a one-request ``Session``: without ``previous_response_id`` it is the
stateless baseline (full pre-inference over the whole input); with it, it resumes the chain's
parked rollout (PARK-4), or forks a cached context, or hydrates from the store (the loader).
A background run's own requests (start, poll, stream-resume, cancel) are
``engine/server/routes/background.py``'s.
"""

from __future__ import annotations

import time

from aiohttp import web

from engine.connection.context_requests import compact_context, count_input_tokens
from engine.connection.loader import load_stored
from engine.connection.session import Session
from engine.core import Engine
from engine.observe.benchclock import TimedSink
from engine.server.routes import background
from engine.server.routes.export import tokens_body
from engine.server.transport import bodies, codex_headers, idempotency, identity, ratelimits
from engine.server.transport.http import (
    JSON,
    HttpSink,
    PageQuery,
    error_response,
    json_response,
    page,
)
from engine.server.transport.keys import BACKGROUND, DRAINING, ENGINE, REQUESTS, SERVER, SESSIONS
from engine.server.transport.node import NODES, RunRequest
from engine.server.transport.ws import serve_socket
from engine.store import ResponseRecord, StoreError
from engine.store.failures import wire_error
from engine.store.framing import ANY_OWNER, OwnerFilter
from protocol.codec import decode_compact_body, decode_create_body, encode
from protocol.errors import (
    HttpStatusError,
    InvalidRequest,
    NotFound,
    ServerError,
    Unavailable,
    failure_code,
    response_not_found,
)


async def create_response(request: web.Request) -> web.StreamResponse:
    body = await bodies.read_body(request)
    key = request.headers.get(idempotency.HEADER)
    if key is None:
        return await _create(request, body, None)
    return await idempotency.once(request, key, body, lambda tap: _create(request, body, tap))


async def _create(
    request: web.Request, body: bytes, tap: idempotency.Tap | None
) -> web.StreamResponse:
    engine: Engine = request.app[ENGINE]
    start = time.perf_counter()
    params = decode_create_body(body, engine.tools)  # repeated tools reused (CACHE-7)
    params.stream_id = None  # WebSocket-only (WS-2); ignored over HTTP
    model = params.model or engine.config.default_model
    codex_headers.note_model(request, model)  # its answer's `openai-model` (CODEX-21)
    if params.background:  # detached from this request (BG-1)
        return await background.create(request, params, tap)
    owner = await identity.owner(request)
    http_sink = HttpSink(request, params.stream, owner, tap)
    sink: HttpSink | TimedSink = http_sink
    if engine.bench_clock is not None:  # --bench-timings (OBS-5)
        sink = TimedSink(http_sink)
        sink.add_decode(time.perf_counter() - start)
    quota = await ratelimits.quota_for(request)
    session = Session(engine, sink, transport="http", owner=owner, quota=quota, retains=True)
    session.traceparent = request.headers.get("traceparent")  # OTEL-2
    live = request.app[REQUESTS]  # the inspector lists in-flight HTTP creates (INSP-4)
    live.add(session)
    try:
        await session.serve_one(params)
    finally:
        live.discard(session)
        try:
            await session.close()
        finally:
            await http_sink.close()
    return _finish(http_sink)


async def compact_response(request: web.Request) -> web.Response:
    """``POST /v1/responses/compact`` (COMPACT-1)."""
    params = decode_compact_body(await bodies.read_body(request))
    owner = await identity.owner(request)
    return json_response(await compact_context(request.app[ENGINE], params, owner=owner))


async def input_tokens(request: web.Request) -> web.Response:
    """``POST /v1/responses/input_tokens`` (TOKENS-1)."""
    params = decode_create_body(await bodies.read_body(request))
    owner = await identity.owner(request)
    return json_response(await count_input_tokens(request.app[ENGINE], params, owner=owner))


def _finish(sink: HttpSink) -> web.StreamResponse:
    if sink.error is not None:
        err = sink.error.error
        body = encode({"error": err})
        status, headers = sink.error.status, sink.error.headers  # RATE-5, CODEX-24
        return web.Response(body=body, status=status, content_type=JSON, headers=headers)
    if sink.stream is not None:
        return sink.stream
    if sink.terminal is None:
        raise ServerError()
    if sink.terminal.status == "failed":
        # The model call already ran; an SDK retry would run (and bill) it again (HTTP-5).
        # A fault that names its own code keeps it (TOK-33); everything else is generic.
        info = sink.terminal.error
        code = failure_code(info.message) if info is not None else "server_error"
        message = info.message if info is not None and code != "server_error" else None
        failed = error_response(
            ServerError(code, message or "The model failed to generate a response.")
        )
        failed.headers["x-should-retry"] = "false"
        return failed
    return json_response(sink.terminal)


async def responses_get(request: web.Request) -> web.StreamResponse:
    """``GET /v1/responses`` is the WebSocket endpoint (WS-1)."""
    if request.headers.get("Upgrade", "").lower() != "websocket":
        raise InvalidRequest(
            "websocket_upgrade_required",
            "GET /v1/responses opens a WebSocket; use POST /v1/responses for HTTP.",
            None,
        )
    config = request.app[SERVER]
    if not config.websocket_enabled:
        request.app[ENGINE].counters["ws.disabled_refusals"] += 1  # clients fall back (WS-13)
        raise HttpStatusError(
            426,
            "websocket_disabled",
            "WebSocket mode is disabled here; use HTTP POST /v1/responses.",
        )
    if request.app[DRAINING][0]:
        raise Unavailable("server_shutting_down", "The server is shutting down.", None)
    if len(request.app[SESSIONS]) >= config.max_connections:
        raise Unavailable(
            "too_many_connections",
            f"This server accepts at most {config.max_connections} WebSocket connections.",
            None,
        )
    return await serve_socket(request, request.app[ENGINE], config)


def _stored(request: web.Request) -> tuple[Engine, str]:
    return request.app[ENGINE], request.match_info["response_id"]


async def _record(request: web.Request) -> ResponseRecord:
    """The stored record named by the path, or the error that says why not (STORE-8, STORE-9).
    Another key's response is not found, exactly like a missing one (OWN-2)."""
    engine, response_id = _stored(request)
    owner = await identity.owner(request)
    try:
        record = await engine.store.get(response_id, owner)  # owner checked before decoding
    except StoreError as exc:
        raise wire_error(exc) from None
    if record is None:
        raise response_not_found(response_id)
    return record


async def retrieve(request: web.Request) -> web.StreamResponse:
    """``GET /v1/responses/{id}``: JSON, or with ``stream=true`` the event stream replayed
    after ``starting_after`` and then followed (HTTP-6, BG-4, BG-5)."""
    runs, response_id, response = await background.lookup(request)
    if not background.flag(request.query.get("stream")):
        return json_response(response)
    starting_after = background.starting_after(request.query.get("starting_after"))
    log = runs.event_log(response_id)
    if log is None and response.background:  # its run's node relays it (LIVE-2)
        owner = await identity.owner(request)
        asked = RunRequest(response_id, owner, starting_after=starting_after)
        relayed = await request.app[NODES].follow(request, asked)
        if relayed is not None:
            return relayed
    if log is None:
        raise InvalidRequest(
            "invalid_value",
            "Only a running or recently finished background response can be streamed; "
            "retrieve it without stream=true.",
            "stream",
        )
    log.check_start(starting_after)
    return await background.stream(request, log, starting_after)


async def cancel(request: web.Request) -> web.Response:
    """``POST /v1/responses/{id}/cancel`` (BG-6)."""
    runs, response_id, response = await background.lookup(request)
    if not response.background:
        raise InvalidRequest(
            "response_not_cancellable", "Only background responses can be cancelled.", None
        )
    run = runs.find(response_id)
    if run is not None:
        await run.cancel()
        return json_response(run.snapshot())
    if response.status in ("queued", "in_progress"):  # running on another node? (LIVE-2)
        asked = RunRequest(response_id, await identity.owner(request))
        cancelled = await request.app[NODES].cancel(request, asked)
        if cancelled is not None:
            return cancelled
        if request.app[ENGINE].handover.enabled:  # nobody runs it: settled failed (LIVE-3)
            return json_response((await background.lookup(request, gone=True))[2])
    if response.status in ("queued", "in_progress"):
        raise InvalidRequest(
            "response_not_cancellable",
            "This background response runs in another server process.",
            None,
        )
    return json_response(response)  # already finished: cancelling again changes nothing


async def delete_response(request: web.Request) -> web.Response:
    """Removes it from the store and from every cache of this process (STORE-11, HYD-5). Only
    its owner, or an operator key, may delete it, corrupt or not (OWN-5)."""
    engine, response_id = _stored(request)
    owner: OwnerFilter = ANY_OWNER if identity.is_admin(request) else await identity.owner(request)
    run = request.app[BACKGROUND].find(response_id)
    if run is not None and (owner is ANY_OWNER or run.owner == owner):
        await run.cancel()  # a running background response is cancelled first (BG-9)
    elif run is None:  # ... also where another node runs it (LIVE-2)
        mine = None if owner is ANY_OWNER else owner
        asked = RunRequest(response_id, mine, any_owner=owner is ANY_OWNER)
        await request.app[NODES].cancel(request, asked)
    try:
        deleted = await engine.store.delete(response_id, owner)
    except StoreError as exc:
        raise wire_error(exc) from None
    if not deleted:
        raise response_not_found(response_id)
    return json_response({"id": response_id, "object": "response", "deleted": True})


async def response_tokens(request: web.Request) -> web.Response:
    """``GET /v1/responses/{id}/tokens`` (TOK-8): the model-token trajectory up to that
    response, read back from the store; owner-checked like every id route (OWN-2)."""
    engine, response_id = _stored(request)
    hydrated = await load_stored(engine, response_id, owner=await identity.owner(request))
    if not hydrated.tokens:
        message = f"Response '{response_id}' has no token trajectory (not a tokens route)."
        raise NotFound("response_tokens_not_found", message, None)
    return json_response(tokens_body(response_id, hydrated))


async def list_input_items(request: web.Request) -> web.Response:
    """``GET /v1/responses/{id}/input_items`` (HTTP-6): one page of the stored input items."""
    record = await _record(request)
    return json_response(page(record.input_items, PageQuery.of(request.query), None))


def register(app: web.Application) -> None:
    """Every ``/v1/responses`` route (the export route before ``{response_id}``'s)."""
    from engine.server.routes.export import export_tokens

    app.router.add_get("/v1/responses", responses_get)
    app.router.add_post("/v1/responses", create_response)
    app.router.add_post("/v1/responses/compact", compact_response)
    app.router.add_post("/v1/responses/input_tokens", input_tokens)
    app.router.add_get("/v1/responses/tokens/export", export_tokens)
    app.router.add_get("/v1/responses/{response_id}", retrieve)
    app.router.add_delete("/v1/responses/{response_id}", delete_response)
    app.router.add_post("/v1/responses/{response_id}/cancel", cancel)
    app.router.add_get("/v1/responses/{response_id}/input_items", list_input_items)
    app.router.add_get("/v1/responses/{response_id}/tokens", response_tokens)
