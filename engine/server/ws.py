"""WebSocket driver: read a frame, decode, hand to the session; write what comes back (WS-1).

Glue only. Every request-scoped failure is turned into an ``error`` event by the session or here,
and the socket stays open (ERR-4).
"""

from __future__ import annotations

import logging

from aiohttp import WSMsgType, web

from engine.core import Engine
from engine.rollout import ClientGone, Mode
from engine.server.keys import SESSIONS
from engine.session import Session
from protocol.codec import decode_client_event, encode
from protocol.errors import InvalidRequest, ProtocolError
from protocol.events import ServerEvent

log = logging.getLogger("rollout.ws")
APPEND_BETA = "rollout-append=v1"  # OpenAI-Beta value that makes append mode the default


class WsSink:
    """Encodes each event once and writes it as one text frame."""

    __slots__ = ("_ws",)

    def __init__(self, ws: web.WebSocketResponse) -> None:
        self._ws = ws

    async def send(self, event: ServerEvent) -> None:
        if self._ws.closed:
            raise ClientGone
        try:
            await self._ws.send_frame(encode(event), WSMsgType.TEXT)
        except (ConnectionError, RuntimeError) as exc:
            raise ClientGone from exc


def default_mode(request: web.Request) -> Mode:
    beta = request.headers.get("OpenAI-Beta", "")
    return Mode.APPEND if APPEND_BETA in beta else Mode.STANDARD


async def serve_socket(request: web.Request, engine: Engine, max_frame: int) -> web.StreamResponse:
    ws = web.WebSocketResponse(max_msg_size=max_frame, decode_text=False, heartbeat=None)
    await ws.prepare(request)
    sessions: set[Session] = request.app[SESSIONS]
    session = Session(engine, WsSink(ws), transport="ws", default_mode=default_mode(request))
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
