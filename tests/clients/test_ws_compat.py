"""CompatClient against a real server: standard WebSocket mode, one response per turn."""

from __future__ import annotations

from pathlib import Path

import pytest

from clients.coding import SCENARIO_INSTRUCTIONS, SCENARIO_PROMPT, coding_tools
from clients.exceptions import ApiError, ConnectionFailed, ProtocolViolation
from clients.toolbox import ToolRegistry
from clients.ws_append import APPEND_BETA
from clients.ws_compat import CompatClient
from tests.clients.conftest import assert_scenario_completed
from tests.support.server import LiveServer


async def test_scenario_resumes_on_the_fast_path(server: LiveServer, sandbox: Path) -> None:
    async with CompatClient(server.base_url) as client:
        result = await client.run(
            "sim-coding-agent", SCENARIO_PROMPT, coding_tools(sandbox), SCENARIO_INSTRUCTIONS
        )
    assert_scenario_completed(result, sandbox)
    assert len(set(result.response_ids)) == 27
    # Every continuation resumed the suspended coroutine: only new items were processed.
    assert server.engine.counters["create.fast_path"] == 26
    assert server.engine.counters["create.stateless"] == 1


async def test_store_false_works_on_one_socket(server: LiveServer, sandbox: Path) -> None:
    async with CompatClient(server.base_url) as client:
        result = await client.run(
            "sim-coding-agent", SCENARIO_PROMPT, coding_tools(sandbox), store=False
        )
    assert_scenario_completed(result, sandbox)
    assert await server.engine.store.get(result.response_id) is None


async def test_append_default_connection_is_detected(server: LiveServer, sandbox: Path) -> None:
    """With the ``OpenAI-Beta: rollout-append=v1`` upgrade header the connection defaults to
    append mode; a standard-mode client sees ``response.done`` and fails loudly, not hangs."""
    headers = {"OpenAI-Beta": APPEND_BETA}
    async with CompatClient(server.base_url, headers=headers) as client:
        with pytest.raises(ProtocolViolation, match=r"response\.done in standard mode"):
            await client.run("sim-coding-agent", SCENARIO_PROMPT, coding_tools(sandbox))


async def test_error_event_raises_api_error(server: LiveServer) -> None:
    async with CompatClient(server.base_url) as client:
        with pytest.raises(ApiError) as info:
            await client.run("sim", "hi", ToolRegistry(), previous_response_id="resp_missing")
    assert (info.value.status, info.value.code) == (400, "previous_response_not_found")


async def test_unreachable_server_raises_connection_failed(unused_port: int) -> None:
    url = f"http://127.0.0.1:{unused_port}/v1"
    client = CompatClient(url)
    with pytest.raises(ConnectionFailed, match="cannot connect"):
        await client.run("sim", "hi", ToolRegistry())
    await client.close()
    with pytest.raises(ConnectionFailed):
        async with CompatClient(url):
            pass
