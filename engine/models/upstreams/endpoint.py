"""What both upstream backends share: endpoint settings, the streaming POST, error mapping,
secret-safe messages and retries before the first token (SPEC: UP-1..UP-6).

Fault policy: an upstream 4xx is reported to the client with the upstream's status and a
sanitised excerpt of its message (it usually says what in the request was wrong: a context too
long, an unknown model); 5xx, broken streams and timeouts are our side's problem and become a
generic ``server_error``. API keys are read from the environment at request time and never
stored on an object that could be printed or logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import re
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec
from yarl import URL

from engine.models.base import BackendError, Delta
from engine.models.tracecontext import TRACEPARENT
from engine.models.upstreams.http_pool import (
    HttpFault,
    HttpPool,
    PooledConnection,
    Target,
    header_line,
)
from protocol.errors import ProtocolError
from protocol.sse import MAX_EVENT_BYTES, SseDecoder, SseEvent, SseTooLarge

log = logging.getLogger("rollout.upstream")

MAX_MESSAGE_CHARS = 300
_SECRETISH = re.compile(
    r"(sk-[A-Za-z0-9_\-*]{6,}|Bearer\s+\S+|(?:api[_-]?key|token|secret)[\"']?\s*[:=]\s*\S+)",
    re.IGNORECASE,
)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


@dataclass(frozen=True)
class Endpoint:
    """Where and how to reach one upstream server. Holds the key's *name*, never its value."""

    base_url: str
    api_key_env: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    connect_timeout: float = 10.0
    read_timeout: float = 300.0  # max silence between two chunks (a long prefill counts)
    retries: int = 0
    retry_backoff: float = 0.25

    def url(self, path: str) -> str:
        return self.base_url.rstrip("/") + path

    @property
    def display(self) -> str:
        """The base URL as it may appear in logs (no user info, no query)."""
        url = URL(self.base_url)
        return str(url.with_user(None).with_query(None))

    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) if self.api_key_env else None

    def request_headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        headers.update(self.headers)
        key = self.api_key()
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    # The request head's fixed part built once per path, not per request (the upstream hop was
    # the largest share of a turn's CPU, docs/benchmark.md BENCH-11); the key and the trace
    # header are added per request (the key is read from the environment each time, UP-1).
    @functools.cached_property
    def _targets(self) -> dict[str, Target]:
        return {}

    def target(self, path: str) -> Target:
        target = self._targets.get(path)
        if target is None:
            fixed = {"Content-Type": "application/json", "Accept": "text/event-stream"}
            fixed.update(self.headers)
            target = self._targets[path] = Target(self.url(path), fixed)
        return target

    def request_head(self, target: Target, traceparent: str | None) -> bytes:
        """``request_headers()`` on the wire: the fixed head, then the key and the trace."""
        key = self.api_key()
        if not key and traceparent is None:
            return target.head
        extra = header_line("Authorization", f"Bearer {key}") + "\r\n" if key else ""
        if traceparent is not None:
            extra += header_line("traceparent", traceparent) + "\r\n"
        return target.head + extra.encode("latin-1")


class UpstreamError(BackendError):
    """The upstream failed. ``status`` is the upstream's HTTP status when it answered with one."""

    def __init__(self, message: str, status: int | None = None, *, retryable: bool = False):
        super().__init__(message)
        self.message = message
        self.status = status
        self.retryable = retryable
        self.fallback = False  # set by a backend whose next attempt sends a different request

    @property
    def rejected(self) -> bool:
        """The upstream refused the request itself (4xx): the client may be able to fix it."""
        return self.status is not None and 400 <= self.status < 500

    def protocol_error(self) -> ProtocolError | None:
        """A 4xx reaches the client with the upstream's status and our sanitised message; None
        (a generic ``server_error``) for everything else."""
        if self.status is None or not self.rejected:
            return None
        return UpstreamRejected(self.status, self.message)


class UpstreamRejected(ProtocolError):
    """An upstream 4xx as the client sees it: the upstream's status, code ``upstream_error``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__("upstream_error", message, None)
        self.status = status  # type: ignore[misc]  # per instance: whatever the upstream said


def safe_message(raw: bytes | str, secrets: tuple[str | None, ...] = ()) -> str:
    """A short, single-line excerpt of an upstream error with anything secret-looking removed."""
    text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
    text = _error_text(text)
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "[redacted]")
    text = _SECRETISH.sub("[redacted]", text)
    text = _CONTROL.sub(" ", text).strip()
    if len(text) > MAX_MESSAGE_CHARS:
        text = text[: MAX_MESSAGE_CHARS - 1] + "…"
    return text or "no message"


def _error_text(text: str) -> str:
    """The message inside the common error bodies: OpenAI/Ollama ``{"error": {...}}`` or
    ``{"error": "..."}``, vLLM ``{"message": ...}``, FastAPI ``{"detail": ...}``."""
    try:
        body: Any = msgspec.json.decode(text)
    except msgspec.DecodeError:
        return text
    if not isinstance(body, dict):
        return text
    error = body.get("error")
    if isinstance(error, dict):
        error = error.get("message")
    for candidate in (error, body.get("message"), body.get("detail")):
        if isinstance(candidate, str) and candidate:
            return candidate
    return text


async def _status_error(resp: PooledConnection, endpoint: Endpoint) -> UpstreamError:
    body = await resp.read(64 * 1024)
    message = safe_message(body, (endpoint.api_key(),))
    status = resp.status
    log.warning("upstream %s answered HTTP %d: %s", endpoint.display, status, message)
    if 400 <= status < 500:
        text = f"The model server rejected the request (HTTP {status}): {message}"
        return UpstreamError(text, status, retryable=status in (408, 429))
    return UpstreamError(f"The model server failed (HTTP {status}).", status, retryable=True)


def post_stream(pool: HttpPool, endpoint: Endpoint, path: str, body: bytes) -> PostStream:
    """POST ``body``; ``async with`` it for the open streaming response (``PostStream``)."""
    return PostStream(pool, endpoint, path, body)


class PostStream:
    """POST ``body`` and hand out the open streaming response for an ``async with`` block;
    transport faults and error statuses become ``UpstreamError``. Leaving the block early
    (cancellation, client gone) closes the connection rather than draining it, so the upstream
    sees the disconnect and stops. A class, not an ``asynccontextmanager``: once a turn, its
    async generator and the context manager's calls around it cost more than the request's
    own work (issue 48 §2)."""

    __slots__ = ("_body", "_endpoint", "_path", "_pool", "_resp")

    def __init__(self, pool: HttpPool, endpoint: Endpoint, path: str, body: bytes) -> None:
        self._pool, self._endpoint, self._path, self._body = pool, endpoint, path, body
        self._resp: PooledConnection | None = None

    async def __aenter__(self) -> PooledConnection:
        endpoint = self._endpoint
        try:
            target = endpoint.target(self._path)
            # the response's trace continues upstream (OTEL-4)
            head = endpoint.request_head(target, TRACEPARENT.get())
        except ValueError as exc:
            log.warning("upstream %s: %s", endpoint.display, exc)
            raise UpstreamError("The model server connection failed.") from None
        try:
            resp = await self._pool.acquire(target, endpoint.connect_timeout)
        except TimeoutError as exc:
            log.warning("upstream %s timed out: %s", endpoint.display, type(exc).__name__)
            raise UpstreamError("The model server timed out.", retryable=True) from exc
        except HttpFault as exc:
            log.warning("upstream %s connection failed: %s", endpoint.display, exc)
            raise UpstreamError("The model server connection failed.", retryable=True) from exc
        try:
            resp.read_timeout = endpoint.read_timeout
            await resp.start(head, self._body)
            if resp.status >= 400:
                raise await _status_error(resp, endpoint)
        except BaseException as exc:
            self._fail(resp, exc)
            raise
        self._resp = resp
        return resp

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, _: object
    ) -> None:
        resp, self._resp = self._resp, None
        if resp is None:
            return
        if exc is not None:
            self._fail(resp, exc)
            return  # the block's own exception goes on
        resp.release()
        self._pool.done(resp)

    def _fail(self, resp: PooledConnection, exc: BaseException) -> None:
        """The connection is closed and handed back; a timeout or a transport fault is raised
        on as an ``UpstreamError`` (worth a retry), anything else as it is."""
        resp.close()
        try:
            endpoint = self._endpoint
            if isinstance(exc, TimeoutError):
                log.warning("upstream %s timed out: %s", endpoint.display, type(exc).__name__)
                raise UpstreamError("The model server timed out.", retryable=True) from exc
            if isinstance(exc, HttpFault):
                log.warning("upstream %s connection failed: %s", endpoint.display, exc)
                raise UpstreamError("The model server connection failed.", retryable=True) from exc
        finally:
            resp.release()
            self._pool.done(resp)


class SseReader:
    """Reads SSE events from an open response, one socket read at a time."""

    def __init__(self, resp: PooledConnection) -> None:
        self._resp = resp
        self._decoder = SseDecoder()
        self._eof = False

    async def batch(self) -> list[SseEvent]:
        """The next events; an empty list means the stream ended."""
        try:
            while not self._eof:
                chunk = await self._resp.readany()
                if not chunk:
                    self._eof = True
                    return self._decoder.close()
                events = self._decoder.feed(chunk)
                if events:
                    return events
        except SseTooLarge:
            raise UpstreamError("The model server sent an oversized event.") from None
        return []


async def _whole(resp: PooledConnection) -> str:
    """A non-streamed answer's body, bounded like one SSE event."""
    data = bytearray()
    while chunk := await resp.readany():
        data += chunk
        if len(data) > MAX_EVENT_BYTES:
            raise UpstreamError("The model server sent an oversized answer.")
    return data.decode("utf-8", errors="replace")


async def drain(resp: PooledConnection, limit_s: float = 1.0) -> None:
    """Read the rest of a finished stream (after ``[DONE]`` or the terminal event) so the
    connection returns to the pool instead of being closed; bounded in time. A stream already
    read to its end (the usual case: the terminal event and the body's end arrive together)
    arms no timer."""
    if resp.at_eof:
        return
    with contextlib.suppress(TimeoutError, HttpFault):
        async with asyncio.timeout(limit_s):
            while await resp.readany():
                pass


def decode_json(data: str, kind: type[Any]) -> Any:
    try:
        return msgspec.json.decode(data, type=kind)
    except msgspec.DecodeError as exc:
        raise UpstreamError("The model server sent a malformed event.") from exc


class Answer(Protocol):
    """One upstream answer being read: maps each SSE event's data to deltas (a chat chunk, a
    Responses event) and knows when the answer is over."""

    @property
    def ended(self) -> bool:
        """The terminal event arrived: nothing more is read."""
        ...

    def feed(self, data: str) -> Iterable[Delta]: ...

    def close(self) -> Iterable[Delta]:
        """The stream is over: the closing deltas (ending with ``Finish``); raises
        ``UpstreamError`` when the answer is incomplete."""
        ...

    def failed(self, exc: UpstreamError) -> None:
        """The request or the stream failed (the error is raised on afterwards)."""
        ...


async def relay(
    pool: HttpPool, endpoint: Endpoint, path: str, body: bytes, answer: Answer
) -> AsyncGenerator[Delta, None]:
    """One attempt, whatever the upstream API: POST ``body``, relay the deltas of each event
    until the terminal one, then read the rest of the stream so the connection is pooled."""
    try:
        async with post_stream(pool, endpoint, path, body) as resp:
            if resp.content_type == "application/json":  # the whole answer at once (TOK-44)
                for delta in answer.feed(await _whole(resp)):
                    yield delta
            reader = SseReader(resp)
            while not answer.ended and (events := await reader.batch()):
                for event in events:
                    for delta in answer.feed(event.data):
                        yield delta
                    if answer.ended:
                        break
            if answer.ended:
                await drain(resp)
    except UpstreamError as exc:
        answer.failed(exc)
        raise
    for delta in answer.close():
        yield delta


def closed_early() -> UpstreamError:
    """The connection ended before the answer did: not a valid answer, worth a retry."""
    return UpstreamError("The model server closed the stream early.", retryable=True)


async def retry_before_first(
    attempt: Callable[[int], AsyncGenerator[Delta, None]], endpoint: Endpoint
) -> AsyncGenerator[Delta, None]:
    """Run ``attempt`` (given its 0-based number), retrying a retryable failure up to
    ``endpoint.retries`` times, but only while nothing has been yielded: once a delta reached the
    client, replaying the request would duplicate output. An error marked ``fallback`` gets one
    immediate extra attempt whatever the budget (the next attempt changes the request)."""
    number = retried = 0
    fell_back = False
    while True:
        deltas = attempt(number)
        started = False
        try:
            try:  # not ``contextlib.aclosing``: three calls a turn for one ``aclose``
                async for delta in deltas:
                    started = True
                    yield delta
            finally:
                await deltas.aclose()
            return
        except UpstreamError as exc:
            if started:
                raise
            if exc.fallback and not fell_back:
                fell_back = True
            elif exc.retryable and retried < endpoint.retries:
                retried += 1
                log.info("retrying upstream %s after: %s", endpoint.display, exc.message)
                await asyncio.sleep(endpoint.retry_backoff * 2 ** (retried - 1))
            else:
                raise
        number += 1
