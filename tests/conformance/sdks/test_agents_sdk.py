"""Agents SDK (``openai-agents`` 0.24) conformance: real agent runs against the server.

The Agents SDK is a demanding client (PROTOCOL.md §9.2): over WebSocket it opens its own socket
(with permessage-deflate), always sends ``stream: true`` and ``include: []``, replays full history
(``function_call`` items with ``id``/``status``) unless response chaining is on, and reads the
turn's items only from ``response.completed.response.output``. A run that ends with the tool's
result in the final output proves the whole loop: call emitted, tool really invoked, output
accepted, final answer produced.
"""

from __future__ import annotations

from typing import Any

import pytest
from agents import Agent, ModelSettings, Runner, function_tool, responses_websocket_session
from agents.models.openai_responses import OpenAIResponsesModel, ResponsesWebSocketError
from openai import AsyncOpenAI

from tests.support.agents_sdk import MODEL, weather_agent
from tests.support.server import LiveServer

# ----------------------------------------------------------------------------- WebSocket


async def test_agents_ws_run_invokes_tool_and_finishes(server: LiveServer) -> None:
    calls: list[str] = []
    async with responses_websocket_session(base_url=server.base_url, api_key="x") as ws:
        result = await ws.run(weather_agent(calls), "What is the weather in Paris?")
    assert calls == ["Paris"]
    assert result.final_output == "Based on the tool results: sunny in Paris"
    assert isinstance(result.final_output, str)
    assert len(result.raw_responses) == 2
    call_turn = result.raw_responses[0].output[0]
    assert call_turn.type == "function_call" and call_turn.arguments == '{"city":"Paris"}'
    assert result.raw_responses[1].usage.input_tokens > 0
    counters = server.engine.counters
    assert counters["create.stateless"] == 2  # default: full history replayed each turn
    assert counters["create.fast_path"] == 0


@pytest.mark.parametrize("store", [True, False])
async def test_agents_ws_auto_previous_response_id_uses_fast_path(
    server: LiveServer, store: bool
) -> None:
    """COMPAT-2: with response chaining the second turn resumes the suspended rollout, also
    with ``store=False`` (the connection cache is all WebSocket mode needs)."""
    calls: list[str] = []
    agent = weather_agent(calls).clone(model_settings=ModelSettings(store=store))
    async with responses_websocket_session(base_url=server.base_url, api_key="x") as ws:
        result = await ws.run(agent, "Weather in Berlin?", auto_previous_response_id=True)
    assert calls == ["Berlin"]
    assert result.final_output == "Based on the tool results: sunny in Berlin"
    first, second = result.raw_responses
    assert first.response_id is not None and second.response_id != first.response_id
    counters = server.engine.counters
    assert counters["create.stateless"] == 1
    assert counters["create.fast_path"] == 1  # the suspended rollout was resumed, not rebuilt


async def test_agents_ws_second_run_continues_by_previous_response_id(server: LiveServer) -> None:
    """Two runs on one warm socket; the second chains onto the first's last response."""
    calls: list[str] = []
    agent = weather_agent(calls)
    async with responses_websocket_session(base_url=server.base_url, api_key="x") as ws:
        first = await ws.run(agent, "Weather in Paris?")
        second = await ws.run(agent, "And in Rome?", previous_response_id=first.last_response_id)
    assert calls == ["Paris", "Rome"]
    assert second.final_output == "Based on the tool results: sunny in Rome"
    assert server.engine.counters["create.cache_hit"] == 1  # the lane's cached latest response


async def test_agents_ws_parallel_tool_calls(server: LiveServer) -> None:
    """Two tools called in one turn (``parallel_tool_calls``), both outputs in the answer."""
    seen: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Weather for a city."""
        seen.append(f"weather:{city}")
        return f"rain in {city}"

    @function_tool
    def get_time(city: str) -> str:
        """Local time in a city."""
        seen.append(f"time:{city}")
        return f"noon in {city}"

    agent: Agent[Any] = Agent(
        name="multi",
        tools=[get_weather, get_time],
        model=MODEL,
        model_settings=ModelSettings(parallel_tool_calls=True),
    )
    async with responses_websocket_session(base_url=server.base_url, api_key="x") as ws:
        result = await ws.run(agent, "Use get_weather and get_time for Oslo")
    assert sorted(seen) == ["time:Oslo", "weather:Oslo"]
    assert result.final_output == "Based on the tool results: rain in Oslo; noon in Oslo"


async def test_agents_ws_streamed_run(server: LiveServer) -> None:
    calls: list[str] = []
    async with responses_websocket_session(base_url=server.base_url, api_key="x") as ws:
        result = ws.run_streamed(weather_agent(calls), "Weather in Lisbon?")
        kinds = [event.type async for event in result.stream_events()]
    assert calls == ["Lisbon"]
    assert result.final_output == "Based on the tool results: sunny in Lisbon"
    assert "raw_response_event" in kinds and "run_item_stream_event" in kinds


async def test_agents_ws_plain_answer_without_tools(server: LiveServer) -> None:
    agent: Agent[Any] = Agent(name="plain", instructions="Be brief.", model=MODEL)
    async with responses_websocket_session(base_url=server.base_url, api_key="x") as ws:
        result = await ws.run(agent, "Say hello")
    assert result.final_output == "This is a simulated answer to: Say hello"


async def test_agents_ws_error_frame_surfaces_as_responses_websocket_error(
    server: LiveServer,
) -> None:
    calls: list[str] = []
    async with responses_websocket_session(base_url=server.base_url, api_key="x") as ws:
        with pytest.raises(ResponsesWebSocketError) as info:
            await ws.run(weather_agent(calls), "Weather?", previous_response_id="resp_gone")
        assert info.value.code == "previous_response_not_found"
        assert info.value.error_type == "invalid_request_error"
        # The SDK reconnects after an error frame; the next run works on the new socket.
        result = await ws.run(weather_agent(calls), "Weather in Vienna?")
    assert result.final_output == "Based on the tool results: sunny in Vienna"


# ----------------------------------------------------------------------------- HTTP


def http_model(client: AsyncOpenAI) -> OpenAIResponsesModel:
    return OpenAIResponsesModel(model=MODEL, openai_client=client)


async def test_agents_http_run_invokes_tool_and_finishes(
    server: LiveServer, client: AsyncOpenAI
) -> None:
    calls: list[str] = []
    result = await Runner.run(weather_agent(calls, model=http_model(client)), "Weather in Madrid?")
    assert calls == ["Madrid"]
    assert result.final_output == "Based on the tool results: sunny in Madrid"
    assert server.engine.counters["create.stateless"] == 2
    # the SDK resends the whole history: the second create continues the first (COMPAT-7)
    assert server.engine.counters["create.resent"] == 1


async def test_agents_http_auto_previous_response_id_continues_by_id(
    server: LiveServer, client: AsyncOpenAI
) -> None:
    calls: list[str] = []
    result = await Runner.run(
        weather_agent(calls, model=http_model(client)),
        "Weather in Athens?",
        auto_previous_response_id=True,
    )
    assert calls == ["Athens"]
    assert result.final_output == "Based on the tool results: sunny in Athens"
    # the chain's suspended rollout, parked by the first create, resumed (PARK-4)
    assert server.engine.counters["create.unparked"] == 1


async def test_agents_http_streamed_run(server: LiveServer, client: AsyncOpenAI) -> None:
    calls: list[str] = []
    result = Runner.run_streamed(weather_agent(calls, model=http_model(client)), "Weather in Nice?")
    deltas: list[str] = []
    async for event in result.stream_events():
        if event.type == "raw_response_event" and event.data.type == "response.output_text.delta":
            deltas.append(event.data.delta)
    assert calls == ["Nice"]
    assert result.final_output == "".join(deltas) == "Based on the tool results: sunny in Nice"
