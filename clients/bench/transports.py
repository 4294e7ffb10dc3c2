"""The four transports the bench compares, written in one style over raw aiohttp.

* ``http_stateless`` (the baseline): the full history every turn over one keep-alive
  connection pool, as the openai SDK sends it (its httpx client pools connections),
  ``store: false``;
* ``http_stateless_cold`` (opt-in, not the baseline): the same, but a new TCP connection and
  HTTP session per request, as naive clients do; labelled so wherever it is reported;
* ``http_previous_id``: ``previous_response_id`` + only the new items, ``store: true``, one
  keep-alive session (as the openai SDK pools connections);
* ``ws_compat``: ``previous_response_id`` + only the new items on one socket, ``store: false``;
* ``ws_append``: one response per rollout, ``response.append`` per tool result, ``store: false``;
* ``ws_compat_store`` (with ``--store``): ``ws_compat`` with ``store: true``, so every turn's
  durable write is in its figures (BENCH-6).

Every request body is encoded before its clock starts, so the client's JSON encoding (largest in
the stateless mode) is not counted as server overhead. For ``http_stateless_cold`` the clock
does include opening the new connection, because that is that variant's inherent cost.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, Protocol

import aiohttp

from clients.bench.lean_wire import ENCODER, BenchError, RawTurnReader, TurnResult, now
from clients.bench.scenario import ToolResult
from protocol.sse import SseDecoder

MODES = ("http_stateless", "http_previous_id", "ws_compat", "ws_append")
COLD_MODE = "http_stateless_cold"  # opt-in with --modes; never part of the default set
STORE_MODE = "ws_compat_store"  # added by --store (BENCH-6)
STORE_MODES = (STORE_MODE,)
ALL_MODES = (*MODES, COLD_MODE, *STORE_MODES)
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
_JSON = {"Content-Type": "application/json"}
RawSocket = aiohttp.ClientWebSocketResponse[Literal[False]]  # frames as bytes, not decoded


# permessage-deflate window bits the bench's sockets offer (``rollout bench --ws-compress``,
# CODEX-25); 0 offers none. Set once by the CLI before any socket opens.
WS_COMPRESS = [0]


async def connect_ws(session: aiohttp.ClientSession, base_url: str) -> RawSocket:
    """A socket to ``/v1/responses`` that hands frames over as bytes (no text decoding)."""
    url = responses_url(base_url).replace("http://", "ws://", 1)
    return await session.ws_connect(
        url, max_msg_size=MAX_MESSAGE_BYTES, decode_text=False, compress=WS_COMPRESS[0]
    )


class Transport(Protocol):
    """Start a rollout, then answer each turn's tool calls; each returns the next turn."""

    async def open(self) -> None: ...

    async def first(self, body: dict[str, Any]) -> TurnResult: ...

    async def answer(self, prev: TurnResult, results: list[ToolResult]) -> TurnResult: ...

    async def close(self) -> None: ...


def responses_url(base_url: str) -> str:
    return base_url.rstrip("/") + "/responses"


async def _read_sse(resp: aiohttp.ClientResponse, reader: RawTurnReader) -> TurnResult:
    if resp.status != 200:
        raise BenchError(f"HTTP {resp.status}: {(await resp.read())[:300]!r}")
    decoder = SseDecoder()
    async for chunk in resp.content.iter_any():
        arrived = now()
        for event in decoder.feed(chunk):
            if reader.feed(event.data, arrived):
                # The turn is timed; the stream is read to its end, as real clients read it, so
                # the keep-alive connection goes back to the pool (a response released with its
                # body unread closes its connection: every turn would pay a new one).
                await resp.read()
                return reader.turn
    raise BenchError("the event stream ended before the turn did")


class _HttpTransport:
    """One keep-alive session (as the openai SDK pools connections); subclasses decide what
    each turn sends."""

    def __init__(self, base_url: str) -> None:
        self.url = responses_url(base_url)
        self.base: dict[str, Any] = {}
        self._session: aiohttp.ClientSession | None = None

    async def open(self) -> None:
        self._session = aiohttp.ClientSession()

    async def _send(self, body: dict[str, Any]) -> TurnResult:
        assert self._session is not None
        data = ENCODER.encode(body)
        reader = RawTurnReader(now(), append=False)
        async with self._session.post(self.url, data=data, headers=_JSON) as resp:
            return await _read_sse(resp, reader)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


class HttpStateless(_HttpTransport):
    """Resends the whole conversation; nothing is kept on the server. One keep-alive pool,
    as the openai SDK keeps one (the honest baseline)."""

    def __init__(self, base_url: str) -> None:
        super().__init__(base_url)
        self.history: list[Any] = []

    async def first(self, body: dict[str, Any]) -> TurnResult:
        self.base = {**body, "store": False, "stream": True}
        self.history = list(body["input"])
        return await self._send({**self.base, "input": self.history})

    async def answer(self, prev: TurnResult, results: list[ToolResult]) -> TurnResult:
        self.history.extend(prev.output)
        self.history.extend(r.item() for r in results)
        return await self._send({**self.base, "input": self.history})


class HttpStatelessCold(HttpStateless):
    """The stateless mode with a new connection and HTTP session per request (labelled
    ``http_stateless_cold``; opt-in, never the baseline)."""

    async def open(self) -> None:
        return None

    async def _send(self, body: dict[str, Any]) -> TurnResult:
        data = ENCODER.encode(body)
        reader = RawTurnReader(now(), append=False)
        connector = aiohttp.TCPConnector(force_close=True)
        async with (
            aiohttp.ClientSession(connector=connector) as session,
            session.post(self.url, data=data, headers=_JSON) as resp,
        ):
            return await _read_sse(resp, reader)


class HttpPreviousId(_HttpTransport):
    """Continues stored responses by id over one keep-alive HTTP session."""

    async def first(self, body: dict[str, Any]) -> TurnResult:
        self.base = {**body, "store": True, "stream": True}
        return await self._send(self.base)

    async def answer(self, prev: TurnResult, results: list[ToolResult]) -> TurnResult:
        items = [r.item() for r in results]
        return await self._send(
            {**self.base, "input": items, "previous_response_id": prev.response_id}
        )


class _WsTransport:
    """One socket for the whole rollout; subclasses decide what each turn sends."""

    append = False

    def __init__(self, base_url: str) -> None:
        self.url = base_url
        self.base: dict[str, Any] = {}
        self._session: aiohttp.ClientSession | None = None
        self._ws: RawSocket | None = None

    async def open(self) -> None:
        self._session = aiohttp.ClientSession()
        self._ws = await connect_ws(self._session, self.url)

    async def _turn(self, event: dict[str, Any]) -> TurnResult:
        ws = self._ws
        assert ws is not None
        frame = ENCODER.encode(event)
        reader = RawTurnReader(now(), append=self.append)
        await ws.send_frame(frame, aiohttp.WSMsgType.TEXT)
        while True:
            msg = await ws.receive()
            arrived = now()
            if msg.type is not aiohttp.WSMsgType.TEXT:
                raise BenchError(f"websocket closed mid-turn ({msg.type.name})")
            if reader.feed(msg.data, arrived):
                return reader.turn

    async def close(self) -> None:
        if self._ws is not None:
            await self._ws.close()
        if self._session is not None:
            await self._session.close()


class WsCompat(_WsTransport):
    """Standard WebSocket mode: a new response per turn, continued by id, only new items."""

    async def first(self, body: dict[str, Any]) -> TurnResult:
        self.base = {"type": "response.create", **body, "store": False}
        return await self._turn(self.base)

    async def answer(self, prev: TurnResult, results: list[ToolResult]) -> TurnResult:
        items = [r.item() for r in results]
        return await self._turn(
            {**self.base, "input": items, "previous_response_id": prev.response_id}
        )


class WsCompatStore(WsCompat):
    """``ws_compat`` with every response stored: the durable write precedes each terminal
    event (STORE-6), so the difference to ``ws_compat`` is the store's per-turn cost."""

    async def first(self, body: dict[str, Any]) -> TurnResult:
        self.base = {"type": "response.create", **body, "store": True}
        return await self._turn(self.base)


class WsAppend(_WsTransport):
    """Experimental append mode: one response; each tool result is a ``response.append``."""

    append = True

    async def first(self, body: dict[str, Any]) -> TurnResult:
        event = {"type": "response.create", **body, "store": False, "rollout_mode": "append"}
        return await self._turn(event)

    async def answer(self, prev: TurnResult, results: list[ToolResult]) -> TurnResult:
        items = [r.item() for r in results]
        return await self._turn(
            {"type": "response.append", "response_id": prev.response_id, "input": items}
        )


def make_transport(mode: str, base_url: str) -> Transport:
    factories: dict[str, Callable[[str], Transport]] = {
        "http_stateless": HttpStateless,
        "http_previous_id": HttpPreviousId,
        "ws_compat": WsCompat,
        "ws_append": WsAppend,
        COLD_MODE: HttpStatelessCold,
        STORE_MODE: WsCompatStore,
    }
    if mode not in factories:
        raise ValueError(f"unknown mode {mode!r}; choose from {', '.join(ALL_MODES)}")
    return factories[mode](base_url)
