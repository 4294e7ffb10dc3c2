"""WebSocket driver: read a frame, decode, hand to the session; write what comes back (WS-1).

Glue only. Every request-scoped failure is turned into an ``error`` event by the session or here,
and the socket stays open (ERR-4).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiohttp import WSCloseCode, WSMsgType, web

from engine.core import Engine
from engine.rollout import ClientGone, Mode
from engine.server.config import ServerConfig
from engine.server.keys import SESSIONS
from engine.session import Session
from protocol.codec import decode_client_event, encode
from protocol.errors import InvalidRequest, ProtocolError
from protocol.events import ServerEvent

log = logging.getLogger("rollout.ws")
APPEND_BETA = "rollout-append=v1"  # OpenAI-Beta value that makes append mode the default


class WsSink:
    """Encodes each event once and writes it as one text frame.

    Backpressure: aiohttp's send waits while the socket's buffers are full, so a slow reader
    slows the sampler down (bounded memory). A reader slower than ``send_timeout`` is
    disconnected with close code 1013 and a reason (LIM-12). The timer is only armed when the
    transport is already backed up, so the per-token path allocates nothing extra."""

    __slots__ = ("_timeout", "ws")

    HIGH_WATER = 64 * 1024  # asyncio's default: above it, the next drain would block

    def __init__(self, ws: web.WebSocketResponse, send_timeout: float) -> None:
        self.ws = ws
        self._timeout = send_timeout

    async def send(self, event: ServerEvent) -> None:
        ws = self.ws
        if ws.closed:
            raise ClientGone
        data = encode(event)
        try:
            transport = ws._req.transport if ws._req is not None else None
            if transport is not None and transport.get_write_buffer_size() > self.HIGH_WATER:
                await self._send_backed_up(data)
            else:
                await ws.send_frame(data, WSMsgType.TEXT)
        except (ConnectionError, RuntimeError) as exc:
            raise ClientGone from exc

    async def _send_backed_up(self, data: bytes) -> None:
        try:
            async with asyncio.timeout(self._timeout):
                await self.ws.send_frame(data, WSMsgType.TEXT)
        except TimeoutError:
            log.warning("closing a WebSocket whose reader fell %.0f s behind", self._timeout)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    self.ws.close(code=WSCloseCode.TRY_AGAIN_LATER, message=b"reader too slow"), 1
                )
            raise ClientGone from None


def default_mode(request: web.Request) -> Mode:
    beta = request.headers.get("OpenAI-Beta", "")
    return Mode.APPEND if APPEND_BETA in beta else Mode.STANDARD


async def serve_socket(
    request: web.Request, engine: Engine, config: ServerConfig
) -> web.StreamResponse:
    ws = web.WebSocketResponse(
        max_msg_size=config.max_frame_bytes, decode_text=False, heartbeat=None
    )
    await ws.prepare(request)
    sessions: set[Session] = request.app[SESSIONS]
    sink = WsSink(ws, config.send_timeout_s)
    session = Session(engine, sink, transport="ws", default_mode=default_mode(request))
    sessions.add(session)
    try:
        async for msg in ws:
            if msg.type is WSMsgType.TEXT:
                await _dispatch(session, msg.data)
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
                await ws.close(code=WSCloseCode.GOING_AWAY, message=b"connection age limit")
                break
    finally:
        sessions.discard(session)
        await session.close()
    return ws


async def _dispatch(session: Session, data: bytes) -> None:
    try:
        event = decode_client_event(data)
    except ProtocolError as err:
        await session.send_error(err)
        return
    await session.handle(event)


async def _frame_error(session: Session, ws: web.WebSocketResponse) -> None:
    """A frame that could not be read (e.g. over the size limit): say so, then aiohttp closes."""
    exc = ws.exception()
    log.info("websocket read error: %s", exc)
    await session.send_error(
        InvalidRequest("frame_too_large", "The message could not be read.", None)
    )
