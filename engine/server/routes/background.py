"""HTTP glue for background responses (SPEC: BG-1..BG-9): start a run, look a response up as of
now (a live run's snapshot, else its settled record), stream a run's event log. The routes that
use them are ``engine/server/routes/v1_responses.py``'s; the runs themselves live in
``engine/connection/background.py``.
"""

from __future__ import annotations

from aiohttp import web

from engine.connection.background import BackgroundRuns, EventLog, EventsExpired
from engine.server.transport import identity, ratelimits
from engine.server.transport.idempotency import Tap
from engine.server.transport.keys import BACKGROUND, DRAINING, ENGINE
from engine.store import StoreError
from engine.store.failures import wire_error
from protocol.codec import encode
from protocol.errors import InvalidRequest, ServerError, Unavailable, response_not_found
from protocol.response import CreateParams, Response

JSON = "application/json"
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


def _json(body: object, status: int = 200) -> web.Response:
    return web.Response(body=encode(body), status=status, content_type=JSON)


async def create(
    request: web.Request, params: CreateParams, tap: Tap | None = None
) -> web.StreamResponse:
    """``background: true``: answer once the create is admitted, with the response ``queued``;
    with ``stream: true``, stream its events from the first (BG-1, BG-2). With an
    Idempotency-Key (``tap``), only the non-streamed form (IDEM-6)."""
    if request.app[DRAINING][0]:
        raise Unavailable("server_shutting_down", "The server is shutting down.", None)
    if tap is not None and params.stream:
        raise InvalidRequest(
            "unsupported_parameter",
            "An Idempotency-Key is not supported with background and stream together; "
            "create without stream and follow with GET /v1/responses/{id}?stream=true.",
            "stream",
        )
    runs = request.app[BACKGROUND]
    owner = await identity.owner(request)
    quota, traceparent = await ratelimits.quota_for(request), request.headers.get("traceparent")
    run = await runs.start(params, owner, quota, traceparent)
    if run.turn is None:  # rejected while admitted or prepared: the create's own error
        error = run.log.error
        if error is None:
            raise ServerError()
        answer = _json({"error": error.error}, error.status)
        answer.headers.update(error.headers or {})  # a 429's figures (RATE-5)
        return answer
    if tap is not None:
        tap.started = True  # admitted: the run is under way (IDEM-3)
    if params.stream:
        return await stream(request, run.log, -1)
    return _json(run.at_admission)


async def lookup(request: web.Request, gone: bool = False) -> tuple[BackgroundRuns, str, Response]:
    """A response as of now: a live run's snapshot, else the stored record (settled, BG-8,
    LIVE-1; ``gone``: the node holding its lease runs nothing of the kind, LIVE-3)."""
    runs = request.app[BACKGROUND]
    response_id = request.match_info["response_id"]
    owner = await identity.owner(request)  # another key's response is not found (OWN-2)
    run = runs.find(response_id)
    if run is not None and run.turn is not None and run.owner == owner:
        return runs, response_id, run.snapshot()
    try:
        record = await request.app[ENGINE].store.get(response_id, owner)
    except StoreError as exc:
        raise wire_error(exc) from None
    if record is None:
        raise response_not_found(response_id)
    return runs, response_id, (await runs.settle(record, gone)).response


async def stream(request: web.Request, log: EventLog, starting_after: int) -> web.StreamResponse:
    stream = web.StreamResponse(headers=SSE_HEADERS)
    await stream.prepare(request)
    try:
        async for data in log.follow(starting_after):
            await stream.write(data)
    except (ConnectionError, EventsExpired):
        # The reader left, or fell out of the bounded log: it resumes with starting_after.
        return stream
    await stream.write_eof()
    return stream


def flag(raw: str | None) -> bool:
    return raw is not None and raw.lower() in ("true", "1")


def starting_after(raw: str | None) -> int:
    if raw is None:
        return -1
    try:
        value = int(raw)
    except ValueError:
        value = -2
    if value < -1:
        raise InvalidRequest(
            "invalid_value", "starting_after must be an integer sequence number.", "starting_after"
        )
    return value
