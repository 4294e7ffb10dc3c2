"""The fixtures every test directory uses: a live server, a server factory, an SDK client.

Registered for the whole suite by ``tests/conftest.py`` (``pytest_plugins``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Protocol, TypeVar

import pytest
from openai import AsyncOpenAI

from engine.core import EngineConfig
from engine.models.router import Router
from tests.support.server import LiveServer, start_server


class Startable(Protocol):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


_S = TypeVar("_S", bound=Startable)


@asynccontextmanager
async def started(thing: _S) -> AsyncIterator[_S]:
    """A fixture's one body for anything with ``start`` and ``stop`` (a peer, a cluster):
    ``thing`` started, and stopped after the test."""
    await thing.start()
    try:
        yield thing
    finally:
        await thing.stop()


def response_shape(response: Any) -> Any:
    """What an SDK ``Response`` says, without its ids (each node makes its own) and its cached
    tokens (what the serving process already held)."""
    items = [
        (item.type, getattr(item, "name", None), getattr(item, "arguments", None), item.status)
        for item in response.output
    ]
    usage = response.usage
    tokens = (usage.input_tokens, usage.output_tokens, usage.total_tokens)
    return response.status, items, response.output_text, tokens


def sdk_client(live: LiveServer, api_key: str = "x") -> AsyncOpenAI:
    """The openai SDK pointed at a live server; no retries, so a failure shows at once."""
    return AsyncOpenAI(base_url=live.base_url, api_key=api_key, max_retries=0)


@pytest.fixture
async def server() -> AsyncIterator[LiveServer]:
    """A real server on an ephemeral loopback port; simulated model at full speed (no pacing)."""
    live = await start_server()
    try:
        yield live
    finally:
        await live.runner.cleanup()


@pytest.fixture
async def server_factory() -> AsyncIterator[Callable[..., Any]]:
    """Start servers with a custom ``EngineConfig``; all are cleaned up after the test."""
    started: list[LiveServer] = []

    async def make(
        config: EngineConfig | None = None, router: Router | None = None, **kwargs: Any
    ) -> LiveServer:
        live = await start_server(config, router, **kwargs)
        started.append(live)
        return live

    try:
        yield make
    finally:
        for live in started:
            await live.runner.cleanup()


@pytest.fixture
async def client(server: LiveServer) -> AsyncIterator[AsyncOpenAI]:
    """The openai SDK against the ``server`` fixture."""
    async with sdk_client(server) as sdk:
        yield sdk
