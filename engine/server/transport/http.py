"""HTTP routes: ``/v1/responses`` (JSON and SSE), retrieval, deletion, input items (HTTP-1..7).

An HTTP create runs through a one-request ``Session``: without ``previous_response_id`` it is the
stateless baseline (full pre-inference over the whole input); with it, it hydrates from the store.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import msgspec
from aiohttp import web

from engine.connection.context_requests import compact_context, count_input_tokens
from engine.connection.loader import load_stored
from engine.connection.session import Session
from engine.core import Engine
from engine.inspector.read_model import note_event
from engine.observe.benchclock import TimedSink
from engine.observe.metrics import CONTENT_TYPE
from engine.rollout.turn import ClientGone
from engine.server.routes import background
from engine.server.routes.cluster_runs import ELSEWHERE, RunRequest
from engine.server.routes.export import tokens_body
from engine.server.transport import bodies, codex_headers, idempotency, identity, ratelimits
from engine.server.transport.keys import (
    BACKGROUND,
    DRAINING,
    ENGINE,
    INSPECTOR,
    REQUESTS,
    SESSIONS,
    UNREADY,
)
from engine.store import ResponseRecord, StoreError
from engine.store.failures import wire_error
from engine.store.framing import ANY_OWNER, OwnerFilter
from protocol.codec import decode_compact_body, decode_create_body, encode, http_error_body
from protocol.errors import (
    InvalidRequest,
    NotFound,
    ProtocolError,
    ServerError,
    Unavailable,
    failure_code,
    response_not_found,
)
from protocol.events import (
    ErrorEvent,
    ResponseCompleted,
    ResponseFailed,
    ResponseIncomplete,
    ServerEvent,
)
from protocol.response import Response
from protocol.sse import frame

JSON = "application/json"


def json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=encode(body), status=status, content_type=JSON)


def error_response(err: ProtocolError) -> web.Response:
    return web.Response(
        body=http_error_body(err), status=err.status, content_type=JSON, headers=err.headers
    )


class _SseResponse(web.StreamResponse):
    """An SSE answer whose head leaves with its first chunk, in one write (HTTP-8); aiohttp's
    plain ``Response`` buffers its head the same way."""

    _send_headers_immediately = False


class HttpSink:
    """Collects the terminal response, or streams SSE once the response is accepted.

    An ``error`` event before anything else means the request was rejected: it becomes the HTTP
    status and JSON body instead of a stream (ERR-2). The SSE frames produced within one
    event-loop iteration leave as one HTTP chunk, written by the sink's own flusher task
    scheduled at the iteration's first frame (HTTP-8); ``flushed`` waits for them."""

    HIGH_WATER = 64 * 1024  # buffered bytes past which a send waits for the flusher

    def __init__(
        self,
        request: web.Request,
        streaming: bool,
        owner: str | None = None,
        tap: idempotency.Tap | None = None,
    ) -> None:
        self.request = request
        self.tap = tap  # an Idempotency-Key's: work started, the SSE frames sent (IDEM-3)
        self.owner = owner  # whose errors these are, for the inspector (INSP-9)
        self.streaming = streaming
        self.stream: web.StreamResponse | None = None
        self.error: ErrorEvent | None = None
        self.terminal: Response | None = None
        self._errors = request.app[INSPECTOR].errors
        self._frames: list[bytes] = []
        self._pending = 0  # bytes in _frames
        self._flusher: asyncio.Task[None] | None = None
        self._gone: BaseException | None = None  # the write that found the client gone

    async def send(self, event: ServerEvent) -> None:
        if isinstance(event, ErrorEvent) and self.stream is None:
            self.error = event
            return
        if isinstance(event, ResponseCompleted | ResponseFailed | ResponseIncomplete):
            self.terminal = event.response
        if self.tap is not None:
            self.tap.started = True
        if not self.streaming:
            return
        if self.stream is None:
            self.stream = _SseResponse(
                headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
            )
            try:
                await self.stream.prepare(self.request)
            except (ConnectionError, RuntimeError) as exc:
                raise ClientGone from exc
        if self._gone is not None:
            raise ClientGone from self._gone
        # Only what goes into an SSE stream: anything else becomes the HTTP answer, which the
        # errors middleware notes (INSP-6).
        note_event(self._errors, "http", event, self.owner)
        data = frame(event)
        if self.tap is not None:
            self.tap.frame(data)
        self._frames.append(data)
        self._pending += len(data)
        if self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush(self.stream))
        elif self._pending > self.HIGH_WATER:
            await self.flushed()  # back-pressure: a slow reader slows the sampler down

    async def _flush(self, stream: web.StreamResponse) -> None:
        try:
            while self._frames:
                data = b"".join(self._frames)
                self._frames.clear()
                self._pending = 0
                if self.terminal is not None:  # the stream's last frames (HTTP-3)
                    await stream.write_eof(data)  # with its end, in one write (HTTP-8)
                else:
                    await stream.write(data)
        except (ConnectionError, RuntimeError) as exc:
            self._gone = exc
            self._frames.clear()
        finally:
            self._flusher = None

    async def flushed(self) -> None:
        """Wait until every frame sent so far has been written; ``ClientGone`` if the client
        went away meanwhile."""
        flusher = self._flusher
        if flusher is not None:
            await asyncio.shield(flusher)
        if self._gone is not None:
            raise ClientGone from self._gone

    async def close(self) -> None:
        """The handler's end: the last frames written (a client gone has nothing to wait for);
        cancelled with the handler, the flusher is cancelled too (no task outlives it)."""
        try:
            await self.flushed()
        except ClientGone:
            pass
        finally:
            if self._flusher is not None:
                self._flusher.cancel()


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
    params = decode_create_body(body)
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
    session = Session(engine, sink, transport="http", owner=owner, quota=quota)
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


class _ErrorBody(msgspec.Struct):
    error: dict[str, Any]


_error_body = msgspec.json.Decoder(_ErrorBody).decode


def note_error(request: web.Request, response: web.StreamResponse) -> None:
    """An HTTP error answer into the inspector's recent errors (INSP-6)."""
    body = getattr(response, "body", None)
    code, message = "", request.path
    if isinstance(body, bytes):
        try:
            error = _error_body(body).error
            code, message = str(error.get("code") or ""), f"{request.path}: {error.get('message')}"
        except msgspec.DecodeError:
            pass
    owner = identity.known_owner(request)  # none yet (a refused key): operators only (INSP-9)
    request.app[INSPECTOR].errors.note("http", response.status, code, message, owner)


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


def _stored(request: web.Request) -> tuple[Engine, str]:
    return request.app[ENGINE], request.match_info["response_id"]


async def bench_timings(request: web.Request) -> web.Response:
    """``GET /v1/bench/timings`` (``--bench-timings`` only, OBS-5): the per-turn records so
    far, oldest first; they are handed over once (the list is cleared)."""
    engine: Engine = request.app[ENGINE]
    if engine.bench_clock is None:
        raise web.HTTPNotFound()
    return json_response({"object": "list", "data": engine.bench_clock.take()})


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
        await request.app[ELSEWHERE].cancel(request, asked)
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
    record = await _record(request)
    order = request.query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequest("invalid_value", "order must be 'asc' or 'desc'.", "order")
    limit = _limit(request.query.get("limit", "20"))
    items = list(record.input_items)
    if order == "desc":
        items.reverse()
    after = request.query.get("after")
    if after is not None:
        ids = [getattr(i, "id", None) for i in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    page = items[:limit]
    ids = [getattr(i, "id", None) for i in page]
    return json_response(
        {
            "object": "list",
            "data": page,
            "first_id": ids[0] if ids else None,
            "last_id": ids[-1] if ids else None,
            "has_more": len(items) > limit,
        }
    )


def _limit(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not 1 <= value <= 100:
        raise InvalidRequest("invalid_value", "limit must be an integer from 1 to 100.", "limit")
    return value


async def healthz(request: web.Request) -> web.Response:
    """Readiness (DRAIN-1): 200 while the node takes new work, 503 from the stop signal on, so
    a balancer's health check takes a draining node out of rotation."""
    if request.app[UNREADY][0] or request.app[DRAINING][0]:
        return error_response(
            Unavailable("server_shutting_down", "The server is shutting down.", None)
        )
    return json_response({"status": "ok"})


async def list_models(request: web.Request) -> web.Response:
    """Every routable name: models, their aliases and the default route's name. ``owned_by``
    names the backend kind (``sim``, ``chat``, ``responses``)."""
    router = request.app[ENGINE].router
    data = []
    for name in router.models():
        backend = router.backend_of(name)
        owner = backend.name if backend is not None else "rollout"
        data.append({"id": name, "object": "model", "created": 0, "owned_by": owner})
    return json_response({"object": "list", "data": data})


async def metrics(request: web.Request) -> web.Response:
    """Prometheus exposition: stage histograms, responses, tokens, findings, cache events."""
    engine: Engine = request.app[ENGINE]
    return web.Response(body=engine.metrics.render(), headers={"Content-Type": CONTENT_TYPE})


async def stats(request: web.Request) -> web.Response:
    """Counters for operators and tests: stage runs, cache paths, post-inference runs."""
    engine: Engine = request.app[ENGINE]
    await asyncio.sleep(0)
    return json_response(
        {
            "stage_runs": dict(engine.stats.runs),
            "stage_items": dict(engine.stats.items),
            "tokens_rendered": engine.stats.tokens_rendered,
            "counters": dict(engine.counters),
            "post_inference_runs": engine.post.runs,
            "router_resolutions": engine.router.resolutions,
            "backends": _backend_stats(engine),
            "open_sessions": len(request.app[SESSIONS]),
            "store": {"kind": engine.store.kind, "available": engine.store.available},
            "hydration_cache": {"entries": len(engine.hydrated), "bytes": engine.hydrated.nbytes},
            "parked": len(engine.parking),
            # what the memory budget's parts hold now, bytes (MEM-12, MEM-15): the soak's
            # RSS series is read beside it (LIVE-9)
            "budget_held": {
                "hydration": engine.hydrated.nbytes,
                "parking": engine.parking.nbytes,
                "background": request.app[BACKGROUND].budget.nbytes,
                "store": engine.store.held_bytes,
            },
            "pid": os.getpid(),  # which worker answered (WORK-1)
        }
    )


def _backend_stats(engine: Engine) -> dict[str, dict[str, int]]:
    """Upstream backends' counters (requests, dropped items, estimated usage), listed once per
    backend under its first route name (aliases share the backend)."""
    out: dict[str, dict[str, int]] = {}
    seen: set[int] = set()
    for name, backend in sorted(engine.router.routes.items()):
        counters = backend.stats
        if counters is not None and id(backend) not in seen:
            seen.add(id(backend))
            out[name] = dict(counters)
    return out
