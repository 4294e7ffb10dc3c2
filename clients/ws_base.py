"""One WebSocket connection to ``/v1/responses``, shared by the append and compat clients.

The connection is opened lazily and reused across rollouts. One rollout runs at a time per
client (a lock), because both modes read the default lane's events in order. After any failure
mid-rollout the socket is dropped, so a half-finished rollout can never leak events into the
next one; the next ``run`` reconnects.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any, Self

import aiohttp

from clients.exceptions import ConnectionFailed
from clients.loop import Hooks, TurnEnd, TurnReader
from clients.wire import decode_event, encode, ws_url

MAX_MESSAGE_BYTES = 64 * 1024 * 1024


class WsClient:
    """Connection management plus "read events until the turn ends"."""

    def __init__(
        self,
        base_url: str,
        *,
        hooks: Hooks | None = None,
        headers: dict[str, str] | None = None,
        session: aiohttp.ClientSession | None = None,
        receive_timeout: float | None = None,
    ) -> None:
        self.url = ws_url(base_url)
        self.hooks = hooks or Hooks()
        self.headers = dict(headers or {})
        self.receive_timeout = receive_timeout
        self._session = session
        self._owns_session = session is None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._lock = asyncio.Lock()

    async def __aenter__(self) -> Self:
        try:
            await self.connect()
        except BaseException:
            await self.close()  # __aexit__ will not run: release the session now
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def connect(self) -> aiohttp.ClientWebSocketResponse:
        if self._ws is not None and not self._ws.closed:
            return self._ws
        if self._session is None:
            self._session = aiohttp.ClientSession()
        try:
            self._ws = await self._session.ws_connect(
                self.url,
                headers=self.headers,
                max_msg_size=MAX_MESSAGE_BYTES,
                autoping=True,
            )
        except (aiohttp.ClientError, OSError) as exc:
            raise ConnectionFailed(f"cannot connect to {self.url}: {exc}") from exc
        return self._ws

    async def close(self) -> None:
        await self._drop_socket()
        if self._owns_session and self._session is not None:
            await self._session.close()
            self._session = None

    async def _drop_socket(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            await ws.close()

    async def send(self, payload: dict[str, Any]) -> None:
        ws = await self.connect()
        try:
            await ws.send_frame(encode(payload), aiohttp.WSMsgType.TEXT)
        except (aiohttp.ClientError, ConnectionError, RuntimeError) as exc:
            raise ConnectionFailed(f"connection to {self.url} lost while sending: {exc}") from exc

    async def read_turn(self, reader: TurnReader) -> TurnEnd:
        """Read frames until ``reader`` reports the end of a turn."""
        ws = await self.connect()
        while True:
            try:
                msg = await ws.receive(timeout=self.receive_timeout)
            except TimeoutError as exc:
                raise ConnectionFailed(f"no event from {self.url} in time") from exc
            if msg.type is not aiohttp.WSMsgType.TEXT:
                raise ConnectionFailed(_closed_reason(msg, ws))
            event = decode_event(msg.data)
            if event is None:
                continue
            end = reader.feed(event)
            if end is not None:
                return end


def _closed_reason(msg: aiohttp.WSMessage, ws: aiohttp.ClientWebSocketResponse) -> str:
    if msg.type is aiohttp.WSMsgType.ERROR:
        return f"websocket error: {ws.exception()}"
    if msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED):
        return f"server closed the websocket (code {ws.close_code}) before the rollout finished"
    return f"unexpected {msg.type.name} frame"
