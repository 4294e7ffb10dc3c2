"""A turn with several tool calls: every client runs them concurrently and answers them at once."""

from __future__ import annotations

import asyncio

import pytest

from clients.http import HttpClient
from clients.loop import RolloutClient
from clients.toolbox import ToolRegistry
from clients.ws_append import AppendClient
from clients.ws_compat import CompatClient
from tests.support.server import LiveServer


def meeting_tools() -> ToolRegistry:
    """Two tools that only finish when both are running at the same time."""
    registry = ToolRegistry()
    barrier = asyncio.Barrier(2)

    @registry.tool
    async def lookup(city: str) -> str:
        await barrier.wait()
        return f"sunny in {city}"

    @registry.tool
    async def clock(city: str) -> str:
        await barrier.wait()
        return f"noon in {city}"

    return registry


@pytest.mark.parametrize("client_type", [AppendClient, CompatClient, HttpClient])
async def test_parallel_calls_in_one_turn(server: LiveServer, client_type: type) -> None:
    client: RolloutClient = client_type(server.base_url)
    try:
        async with asyncio.timeout(10):
            result = await client.run("sim", "Use lookup and clock for Paris", meeting_tools())
    finally:
        await client.close()
    assert result.turns == 2
    assert [(r.name, r.output) for r in result.tool_calls] == [
        ("lookup", "sunny in Paris"),
        ("clock", "noon in Paris"),
    ]
    assert result.final_text == "Based on the tool results: sunny in Paris; noon in Paris"
