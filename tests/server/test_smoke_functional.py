"""Smoke: the openai SDK over HTTP and WebSocket against the real server (CONF-2)."""

from __future__ import annotations

from openai import AsyncOpenAI

from tests.support.server import LiveServer
from tests.support.tools import WEATHER


async def test_http_create_text(server: LiveServer) -> None:
    client = AsyncOpenAI(base_url=server.base_url, api_key="x")
    response = await client.responses.create(model="gpt-x", input="Say hi")
    assert response.status == "completed"
    assert response.output_text.startswith("This is a simulated answer to: Say hi")
    assert response.usage is not None and response.usage.input_tokens > 0
    await client.close()


async def test_ws_tool_round_trip_fast_path(server: LiveServer) -> None:
    client = AsyncOpenAI(base_url=server.base_url, api_key="x")
    async with client.responses.connect() as conn:
        await conn.response.create(
            model="gpt-x", input="Weather in Paris?", tools=[WEATHER], store=False
        )
        async for event in conn:
            if event.type == "response.completed":
                first = event.response
                break
        call = first.output[0]
        assert call.type == "function_call" and call.arguments == '{"city":"Paris"}'
        await conn.response.create(
            model="gpt-x",
            previous_response_id=first.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
            tools=[WEATHER],
            store=False,
        )
        async for event in conn:
            if event.type == "response.completed":
                second = event.response
                break
    assert second.output_text == "Based on the tool results: sunny"
    assert server.engine.counters["create.fast_path"] == 1
    await client.close()
