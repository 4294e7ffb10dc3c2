"""The HTTP side of the transport (HTTP-1..HTTP-9): the JSON and error answers, the SSE sink a
create's session writes its events to, and one page of a listed resource. No route lives here
(``engine/server/routes/``); routes use these.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import msgspec
from aiohttp import web

from engine.inspector.read_model import NOTED_EVENTS, note_event
from engine.rollout.turn import ClientGone
from engine.server.transport import idempotency, identity
from engine.server.transport.keys import INSPECTOR
from protocol.codec import encode, http_error_body
from protocol.errors import InvalidRequest, ProtocolError
from protocol.events import (
    ErrorEvent,
    ResponseCompleted,
    ResponseFailed,
    ResponseIncomplete,
    ServerEvent,
)
from protocol.response import Response
from protocol.sse import frame

T = TypeVar("T")

_Terminal = ResponseCompleted | ResponseFailed | ResponseIncomplete
_TERMINAL = frozenset({ResponseCompleted, ResponseFailed, ResponseIncomplete})


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
        kind = type(event)
        if kind is ErrorEvent and self.stream is None:
            assert isinstance(event, ErrorEvent)
            self.error = event
            return
        if kind in _TERMINAL:
            self.terminal = cast(_Terminal, event).response
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
        if kind in NOTED_EVENTS:  # an error or a failure, for the inspector (INSP-6)
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


def page_limit(raw: str) -> int:
    """A listing's ``limit``: 1..100, else 400 naming ``limit`` (HTTP-6, CONV-3)."""
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not 1 <= value <= 100:
        raise InvalidRequest("invalid_value", "limit must be an integer from 1 to 100.", "limit")
    return value


@dataclass(frozen=True)
class PageQuery:
    """A listing's query, checked: ``order`` (``asc`` or ``desc``, the default), ``after`` (an
    item id: the page starts past it; unknown, an empty page), ``limit`` (1..100, default 20)."""

    order: str
    after: str | None
    limit: int

    @classmethod
    def of(cls, query: Mapping[str, str]) -> PageQuery:
        order = query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise InvalidRequest("invalid_value", "order must be 'asc' or 'desc'.", "order")
        return cls(order, query.get("after"), page_limit(query.get("limit", "20")))


def page(items: Sequence[T], asked: PageQuery, empty_id: str | None) -> dict[str, Any]:
    """One page of ``items`` (oldest first) as ``asked``, with ``has_more`` when items remain
    past the page (HTTP-6, CONV-3). ``empty_id`` is ``first_id`` and ``last_id`` of an empty
    page."""
    listed = list(items)
    if asked.order == "desc":
        listed.reverse()
    if asked.after is not None:
        ids = [getattr(item, "id", None) for item in listed]
        listed = listed[ids.index(asked.after) + 1 :] if asked.after in ids else []
    limit = asked.limit
    shown = listed[:limit]
    ids = [getattr(item, "id", None) for item in shown]
    return {
        "object": "list",
        "data": shown,
        "first_id": ids[0] if ids else empty_id,
        "last_id": ids[-1] if ids else empty_id,
        "has_more": len(listed) > limit,
    }
