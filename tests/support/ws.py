"""Reading a raw WebSocket (aiohttp's client) frame by frame."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from protocol.events import TERMINAL_TYPES, ResponseCompleted

Event = dict[str, Any]
TERMINAL_OR_ERROR = (*sorted(TERMINAL_TYPES), "error")
RECV_TIMEOUT_S = 10.0  # a frame that does not come in this long is a failed test, not a hang


async def next_event(ws: aiohttp.ClientWebSocketResponse) -> Event:
    """The next frame, which must be a JSON text frame."""
    msg = await ws.receive(timeout=RECV_TIMEOUT_S)
    assert msg.type is aiohttp.WSMsgType.TEXT, msg
    event: Event = json.loads(msg.data)
    return event


async def read_until(ws: aiohttp.ClientWebSocketResponse, *types: str) -> list[Event]:
    """Every event up to and including the first whose ``type`` is one of ``types``."""
    seen: list[Event] = []
    while not seen or seen[-1]["type"] not in types:
        seen.append(await next_event(ws))
    return seen


async def turn(ws: aiohttp.ClientWebSocketResponse, event: Event, *types: str) -> list[Event]:
    """Send one client event; its events up to one of ``types`` (default: the terminal ones or
    an ``error``)."""
    await ws.send_str(json.dumps(event))
    return await read_until(ws, *(types or TERMINAL_OR_ERROR))


class HeldTerminal:
    """The server's next ``response.completed`` frame is written and flushed, but its send
    returns only on ``release``: the window in which a quick client answers a terminal frame
    before the rollout that sent it resumes (a socket draining, STEER-7, APPEND-5)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from engine.server.transport.ws import WsSink

        self.held, self.released = asyncio.Event(), asyncio.Event()
        send = WsSink.send

        async def slow_terminal(sink: WsSink, event: Any) -> None:
            await send(sink, event)
            if isinstance(event, ResponseCompleted) and not self.released.is_set():
                sink.flush()  # the frame leaves now
                self.held.set()
                await self.released.wait()

        monkeypatch.setattr(WsSink, "send", slow_terminal)

    def release(self) -> None:
        self.released.set()


class HeldWrite:
    """The store's writes wait for ``release``: the window between a response's terminal
    event being built and its frame being sent (its durable write, STORE-6). ``held`` is set
    when a write waits, ``read`` when the session has taken the client event its
    ``handler`` (a ``Targets`` method: ``steer``, ``append``) answers."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, store: Any, handler: str) -> None:
        from engine.connection.targets import Targets

        self.held, self.released, self.read = asyncio.Event(), asyncio.Event(), asyncio.Event()
        put, handle = store.put, getattr(Targets, handler)

        async def slow_put(record: Any) -> Any:
            self.held.set()
            await self.released.wait()
            return await put(record)

        async def watched(targets: Targets, event: Any) -> Any:
            self.read.set()
            return await handle(targets, event)

        monkeypatch.setattr(store, "put", slow_put)
        monkeypatch.setattr(Targets, handler, watched)

    def release(self) -> None:
        self.released.set()
