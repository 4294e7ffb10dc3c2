"""WebSocket driver: read a frame, decode, hand to the session; write what comes back (WS-1).

Glue only. Every request-scoped failure is turned into an ``error`` event by the session or here,
and the socket stays open (ERR-4), but for a text message that is not UTF-8: RFC 6455 makes that
a connection failure, 1007 (WS-17).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web

from engine.connection.inject import MULTI_AGENT_BETA
from engine.connection.session import Session
from engine.core import Engine
from engine.inspector.read_model import NOTED_EVENTS, ErrorRing, note_event
from engine.rollout.turn import ClientGone, Mode
from engine.server.transport import identity, ratelimits
from engine.server.transport.frames import (
    COMPRESS_ONCE_MIN_BYTES,
    COPY_LIMIT,
    DEFLATE_MIN_BYTES,
    Deflater,
    frame_header,
    text_frame,
)
from engine.server.transport.keys import INSPECTOR, SESSIONS
from engine.server.transport.server_config import ServerConfig
from engine.store.framing import ANY_OWNER, OwnerFilter
from protocol.codec import (
    SNAPSHOT_EVENTS,
    SPLICE_MIN_BYTES,
    Repeats,
    decode_client_event,
    encode,
    snapshot_pieces,
)
from protocol.errors import InvalidRequest, ProtocolError, TooManyRequests
from protocol.events import ServerEvent

log = logging.getLogger("rollout.ws")
APPEND_BETA = "rollout-append=v1"  # OpenAI-Beta value that makes append mode the default


def _deflater(ws: web.WebSocketResponse, owner: OwnerFilter) -> Deflater | None:
    """The socket's compressor when permessage-deflate was negotiated (``ws.compress`` is then
    the window bits); aiohttp's writer knows whether the client asked for no context takeover
    (unknown: assume it did, which every client can read). ``owner``: the socket's key, whose
    compressed parts it may reuse (WS-19)."""
    bits = ws.compress
    if not bits:
        return None
    writer = getattr(ws, "_writer", None)
    no_takeover = getattr(writer, "notakeover", True)
    return Deflater(15 if bits is True else int(bits), no_takeover, owner=owner)


class WsSink:
    """Encodes each event once and writes it as one text frame.

    Coalescing: frames produced within one event-loop iteration leave in one ``writelines``
    (one system call) instead of one write each, which was the largest per-turn cost. With
    permessage-deflate too: messages of ``DEFLATE_MIN_BYTES`` or more are compressed here
    (``Deflater``), smaller ones go out uncompressed (WS-19).

    Backpressure: when the socket's buffers pass ``HIGH_WATER`` the sender waits for them to
    drain, so a slow reader slows the sampler down (bounded memory). A reader slower than
    ``send_timeout`` is disconnected with close code 1013 and a reason (LIM-12). The timer is
    armed only then, so the per-token path allocates nothing extra.

    It also counts frames both ways and notes error events, for the inspector (INSP-4, INSP-6):
    two integer additions and one type test per frame."""

    __slots__ = (
        "_deflater",
        "_errors",
        "_frames",
        "_loop",
        "_owner",
        "_pending",
        "_protocol",
        "_splice_min",
        "_timeout",
        "_writer",
        "frames_in",
        "frames_out",
        "ws",
    )

    HIGH_WATER = 64 * 1024  # asyncio's default: above it, the next drain would block

    def __init__(
        self,
        ws: web.WebSocketResponse,
        send_timeout: float,
        errors: ErrorRing | None = None,
        owner: OwnerFilter = ANY_OWNER,
    ) -> None:
        self.ws = ws
        self._timeout = send_timeout
        self._errors = errors if errors is not None else ErrorRing()
        self._owner = owner  # whose errors these are, for the inspector (INSP-9)
        self.frames_in = 0
        self.frames_out = 0
        self._loop = asyncio.get_running_loop()
        self._frames: list[bytes] = []
        self._pending = 0  # bytes in _frames
        # aiohttp's payload writer: its transport and drain(); None -> per-frame sends.
        writer: Any = getattr(ws, "_payload_writer", None)
        coalesce = hasattr(writer, "drain") and hasattr(writer, "protocol")
        self._writer = writer if coalesce else None
        # The connection's protocol: its ``transport`` attribute is what the writer's property
        # returns (None once the connection is lost), read per frame without a call.
        self._protocol: Any = writer.protocol if coalesce else None
        self._deflater = _deflater(ws, owner) if coalesce else None
        # A compressed socket splices what it can compress once (WS-19); a plain one only
        # what is cheaper to splice than to encode again (CODEC-6).
        self._splice_min = SPLICE_MIN_BYTES if self._deflater is None else COMPRESS_ONCE_MIN_BYTES

    async def send(self, event: ServerEvent) -> None:
        ws = self.ws
        if ws.closed:
            raise ClientGone
        self.frames_out += 1
        if type(event) in NOTED_EVENTS:
            note_event(self._errors, "ws", event, self._owner)
        try:
            if self._writer is None:
                await self._send_frame(encode(event))
                return
            if not self._frames:
                self._loop.call_soon(self.flush)
            if type(event) in SNAPSHOT_EVENTS:
                self._add_pieces(snapshot_pieces(event, self._splice_min))
            else:
                self._add(encode(event))
            transport = self._protocol.transport
            if transport is None or transport.is_closing():
                raise ClientGone
            if self._pending + transport.get_write_buffer_size() > self.HIGH_WATER:
                self.flush()
                await self._bounded(self._writer.drain())
        except (ConnectionError, RuntimeError) as exc:
            raise ClientGone from exc

    def _add(self, data: bytes) -> None:
        n = len(data)
        if self._deflater is not None and n >= DEFLATE_MIN_BYTES:
            self._frames += self._deflater.frame(data)  # WS-19
        elif n < COPY_LIMIT:
            self._frames.append(text_frame(data))
        else:  # header and payload as two buffers of one writelines: no copy
            self._frames += (frame_header(n), data)
        self._pending += n

    def _add_pieces(self, pieces: tuple[bytes, ...]) -> None:
        """A Response snapshot, as pieces whose unchanging parts are the very bytes every
        snapshot of them reuses (CODEC-6): written as they are, never joined into a copy."""
        if len(pieces) == 1:
            self._add(pieces[0])
            return
        n = sum(map(len, pieces))
        if self._deflater is not None and n >= DEFLATE_MIN_BYTES:
            self._frames += self._deflater.frame_pieces(pieces)  # WS-19
        else:
            self._frames.append(frame_header(n))
            self._frames += pieces
        self._pending += n

    def flush(self) -> None:
        """Write every buffered frame now (also called before this side closes the socket)."""
        if not self._frames:
            return
        frames, self._frames, self._pending = self._frames, [], 0
        transport = self._protocol.transport if self._protocol is not None else None
        if transport is not None and not transport.is_closing():
            transport.writelines(frames)

    async def _send_frame(self, data: bytes) -> None:
        transport = self.ws._req.transport if self.ws._req is not None else None
        if transport is not None and transport.get_write_buffer_size() > self.HIGH_WATER:
            await self._bounded(self.ws.send_frame(data, WSMsgType.TEXT))
        else:
            await self.ws.send_frame(data, WSMsgType.TEXT)

    async def _bounded(self, waiting: Awaitable[None]) -> None:
        try:
            async with asyncio.timeout(self._timeout):
                await waiting
        except TimeoutError:
            log.warning("closing a WebSocket whose reader fell %.0f s behind", self._timeout)
            self._frames, self._pending = [], 0
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    self.ws.close(code=WSCloseCode.TRY_AGAIN_LATER, message=b"reader too slow"), 1
                )
            raise ClientGone from None

    async def close(self, code: int, message: bytes) -> None:
        """Close from our side, after everything already sent has left."""
        self.flush()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.ws.close(code=code, message=message), 1)


class TimedWsSink(WsSink):
    """--bench-timings only (OBS-5): a ``WsSink`` that times its own sends and deferred flushes
    (the write system call) and the request frames' decoding, for the turn's timing record.
    Being a ``WsSink`` itself, everything that looks for one (shutdown, the inspector's frame
    counts) sees it unchanged; without the switch it is never constructed."""

    __slots__ = ("_decode_s", "_send_s")

    def __init__(
        self,
        ws: web.WebSocketResponse,
        send_timeout: float,
        errors: ErrorRing | None = None,
        owner: OwnerFilter = ANY_OWNER,
    ) -> None:
        super().__init__(ws, send_timeout, errors, owner)
        self._send_s = self._decode_s = 0.0

    async def send(self, event: ServerEvent) -> None:
        start = time.perf_counter()
        try:
            await super().send(event)
        finally:
            self._send_s += time.perf_counter() - start

    def flush(self) -> None:
        start = time.perf_counter()
        super().flush()
        self._send_s += time.perf_counter() - start

    def add_decode(self, seconds: float) -> None:
        self._decode_s += seconds

    def take(self) -> tuple[float, float]:
        """(send, decode) seconds since the previous call (``benchclock.SelfTiming``)."""
        taken = self._send_s, self._decode_s
        self._send_s = self._decode_s = 0.0
        return taken


def _make_sink(
    ws: web.WebSocketResponse,
    engine: Engine,
    config: ServerConfig,
    errors: ErrorRing,
    owner: str | None,
) -> WsSink:
    timed = engine.bench_clock is not None
    return (TimedWsSink if timed else WsSink)(ws, config.send_timeout_s, errors, owner)


def default_mode(request: web.Request) -> Mode:
    beta = request.headers.get("OpenAI-Beta", "")
    return Mode.APPEND if APPEND_BETA in beta else Mode.STANDARD


def _check_key_cap(sessions: set[Session], owner: str | None, cap: int) -> None:
    """LIM-30: one API key holds at most ``cap`` open sockets, so one tenant cannot take every
    connection (and the memory behind them) of a node. An open server has no keys to count."""
    if owner is None or cap <= 0:
        return
    if sum(1 for session in sessions if session.owner == owner) >= cap:
        raise TooManyRequests(
            "too_many_connections_for_key",
            f"This API key has {cap} WebSocket connections open here, the most it may.",
            None,
        )


async def serve_socket(
    request: web.Request, engine: Engine, config: ServerConfig
) -> web.StreamResponse:
    ws = web.WebSocketResponse(
        max_msg_size=config.max_frame_bytes,
        decode_text=False,
        heartbeat=None,
        compress=config.ws_deflate,  # accept permessage-deflate when offered (CODEX-25)
    )
    owner = await identity.owner(request)  # before the upgrade: a failure is an HTTP answer
    quota = await ratelimits.quota_for(request)  # its figures go on the upgrade (RATE-3)
    sessions: set[Session] = request.app[SESSIONS]
    _check_key_cap(sessions, owner, config.max_connections_per_key)
    await ws.prepare(request)
    sink = _make_sink(ws, engine, config, request.app[INSPECTOR].errors, owner)
    if quota is not None and ratelimits.codex_client(request):
        ratelimits.tell_codex(quota, sink.send)
    session = Session(
        engine,
        sink,
        transport="ws",
        default_mode=default_mode(request),
        owner=owner,
        quota=quota,
        multi_agent=MULTI_AGENT_BETA in request.headers.get("OpenAI-Beta", ""),  # INJECT-1
    )
    session.traceparent = request.headers.get("traceparent")  # the upgrade's, for all (OTEL-2)
    sessions.add(session)
    engine.counters["ws.connections"] += 1  # accepted sockets (OBS-4)
    repeats = Repeats()  # the tools and instructions its latest create sent (CACHE-5)
    try:
        async for msg in ws:
            sink.frames_in += 1
            if msg.type is WSMsgType.TEXT:
                if not await _dispatch(session, msg.data, repeats):
                    await sink.close(WSCloseCode.INVALID_TEXT, b"invalid UTF-8")  # WS-17
                    break
            elif msg.type is WSMsgType.BINARY:
                await session.send_error(
                    InvalidRequest(
                        "binary_frame_not_supported",
                        "Send each event as a JSON text frame.",
                        None,
                    )
                )
            elif msg.type is WSMsgType.ERROR:
                await _frame_error(session, ws)
                break
            if session.expired:  # connection age limit: error sent, now a reconnectable close
                await sink.close(WSCloseCode.GOING_AWAY, b"connection age limit")
                break
    finally:
        sessions.discard(session)
        await session.close()
    return ws


async def _dispatch(session: Session, data: bytes, repeats: Repeats) -> bool:
    """Decode and hand on one text message; False when it is not UTF-8 at all (RFC 6455 §8.1:
    the connection is then failed with 1007, WS-17). The decoder validates UTF-8 itself (JSON
    outside strings is ASCII), so only a message it refuses is checked again."""
    timer = session.sink if isinstance(session.sink, TimedWsSink) else None
    start = time.perf_counter() if timer is not None else 0.0
    try:
        event = decode_client_event(data, repeats)
    except ProtocolError as err:
        if not _is_utf8(data):
            return False
        await session.send_error(err)
        return True
    if timer is not None:
        timer.add_decode(time.perf_counter() - start)
    await session.handle(event, len(data))
    return True


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


async def _frame_error(session: Session, ws: web.WebSocketResponse) -> None:
    """A frame that could not be read (e.g. over the size limit): say so, then aiohttp closes."""
    exc = ws.exception()
    log.info("websocket read error: %s", exc)
    await session.send_error(
        InvalidRequest("frame_too_large", "The message could not be read.", None)
    )
