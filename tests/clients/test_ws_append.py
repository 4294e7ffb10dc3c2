"""AppendClient against a real server: the coding scenario in ONE response (APPEND-1..APPEND-6)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from clients.coding import SCENARIO_PROMPT, coding_tools, make_sandbox
from clients.exceptions import ApiError, ConnectionFailed, RolloutFailed
from clients.loop import Hooks, ToolCallRecord
from clients.toolbox import ToolRegistry
from clients.ws_append import AppendClient
from clients.ws_compat import CompatClient
from protocol import events as ev
from protocol.items import FunctionCall
from tests.clients.conftest import assert_scenario_completed
from tests.support.server import LiveServer, start_server

MODEL = "sim-coding-agent"


async def test_scenario_runs_in_one_response(server: LiveServer, sandbox: Path) -> None:
    events: list[ev.ServerEvent] = []
    calls: list[FunctionCall] = []
    results: list[ToolCallRecord] = []
    hooks = Hooks(on_event=events.append, on_tool_call=calls.append, on_tool_result=results.append)
    async with AppendClient(server.base_url, hooks=hooks) as client:
        result = await client.run(MODEL, SCENARIO_PROMPT, coding_tools(sandbox))
    assert_scenario_completed(result, sandbox)
    assert len(result.response_ids) == 1
    kinds = [type(e) for e in events]
    assert kinds.count(ev.ResponseCreated) == 1 and kinds.count(ev.ResponseDone) == 26
    assert kinds.count(ev.ResponseCompleted) == 1 and kinds[-1] is ev.ResponseCompleted
    # Sequence numbers continue across suspensions (the client also checks this as it reads).
    assert [getattr(e, "sequence_number", None) for e in events] == list(range(len(events)))
    assert [c.call_id for c in calls] == [r.call_id for r in results]
    assert result.events == len(events)


async def test_inject_verb(server: LiveServer, sandbox: Path) -> None:
    """``response.inject`` (OpenAI's beta name) is acknowledged by ``response.inject.created``
    before the rollout continues in the same response."""
    events: list[ev.ServerEvent] = []
    async with AppendClient(
        server.base_url, verb="inject", hooks=Hooks(on_event=events.append)
    ) as client:
        result = await client.run(MODEL, SCENARIO_PROMPT, coding_tools(sandbox))
    assert_scenario_completed(result, sandbox)
    assert sum(isinstance(e, ev.InjectCreated) for e in events) == 26


async def test_whole_rollout_usage_matches_standard_mode(
    server: LiveServer, tmp_path: Path
) -> None:
    """The one completed response's usage covers the whole rollout: the same token counts as
    the 27 standard-mode responses added up."""
    async with AppendClient(server.base_url) as client:
        append = await client.run(
            MODEL, SCENARIO_PROMPT, coding_tools(make_sandbox(tmp_path / "a"))
        )
    async with CompatClient(server.base_url) as compat_client:
        compat = await compat_client.run(
            MODEL, SCENARIO_PROMPT, coding_tools(make_sandbox(tmp_path / "b"))
        )
    assert append.usage.input_tokens == compat.usage.input_tokens
    assert append.usage.output_tokens == compat.usage.output_tokens


async def test_error_event_raises_api_error_and_client_recovers(server: LiveServer) -> None:
    async with AppendClient(server.base_url) as client:
        with pytest.raises(ApiError) as info:
            await client.run("sim", "hi", ToolRegistry(), background=True)
        assert info.value.status == 400
        assert (info.value.code, info.value.param) == ("unsupported_parameter", "background")
        result = await client.run("sim", "Say hi", ToolRegistry())
    assert result.final_text.startswith("This is a simulated answer to: Say hi")
    assert result.tool_calls == [] and result.turns == 1


async def test_incomplete_response_raises_rollout_failed(server: LiveServer, sandbox: Path) -> None:
    async with AppendClient(server.base_url) as client:
        with pytest.raises(RolloutFailed) as info:
            await client.run(MODEL, SCENARIO_PROMPT, coding_tools(sandbox), max_output_tokens=1)
    assert info.value.response.status == "incomplete"


async def test_tool_exceptions_are_sent_back_as_outputs(server: LiveServer) -> None:
    """A failing tool does not stop the loop: the model gets the error text and answers."""
    registry = ToolRegistry()

    @registry.tool
    def lookup(city: str) -> str:
        raise RuntimeError(f"no data for {city}")

    async with AppendClient(server.base_url) as client:
        result = await client.run("sim", "Weather in Paris? use lookup", registry)
    assert [(r.name, r.ok) for r in result.tool_calls] == [("lookup", False)]
    assert result.final_text == "Based on the tool results: error: RuntimeError: no data for Paris"


async def test_server_going_away_mid_rollout_raises_connection_failed() -> None:
    """A tool shuts the server down; the client reports the closed socket, it does not hang."""
    live = await start_server()
    registry = ToolRegistry()
    stopping: list[asyncio.Task[None]] = []

    @registry.tool
    def lookup(city: str) -> str:
        stopping.append(asyncio.create_task(live.runner.cleanup()))
        return "sunny"

    try:
        async with AppendClient(live.base_url) as client:
            with pytest.raises(
                ConnectionFailed, match=r"server closed the websocket \(code 1001\)"
            ):
                await client.run("sim", "Weather in Paris? use lookup", registry)
    finally:
        await asyncio.gather(*stopping)
