"""The official openai SDK drives our server over WebSocket while our server talks to the
local upstream peers: a multi-turn tool loop works end to end (CONF-2 with real backends)."""

from __future__ import annotations

from typing import Any

from openai import AsyncOpenAI

from tests.support.server import LiveServer
from tests.support.tools import WEATHER
from tests.upstream.peer import ChatPeer, ResponsesPeer


async def _completed(conn: Any) -> Any:
    async for event in conn:
        if event.type == "response.completed":
            return event.response
        assert event.type not in ("error", "response.failed"), event


async def tool_loop(server: LiveServer, turns: int) -> list[str]:
    """Each user turn: the model calls get_weather, we answer, the model summarises."""
    client = AsyncOpenAI(base_url=server.base_url, api_key="unused")
    answers: list[str] = []
    previous: str | None = None
    try:
        async with client.responses.connect() as conn:
            for turn in range(turns):
                await conn.response.create(
                    model="model-a",
                    input=f"Weather, turn {turn}?",
                    tools=[WEATHER],
                    previous_response_id=previous,
                    store=False,
                )
                response = await _completed(conn)
                call = response.output[-1]
                assert call.type == "function_call" and call.name == "get_weather"
                await conn.response.create(
                    model="model-a",
                    previous_response_id=response.id,
                    input=[
                        {
                            "type": "function_call_output",
                            "call_id": call.call_id,
                            "output": f"sunny-{turn}",
                        }
                    ],
                    tools=[WEATHER],
                    store=False,
                )
                response = await _completed(conn)
                answers.append(response.output_text)
                previous = response.id
    finally:
        await client.close()
    return answers


async def test_sdk_tool_loop_over_chat_upstream(
    chat_server: LiveServer, chat_peer: ChatPeer
) -> None:
    answers = await tool_loop(chat_server, turns=2)
    assert answers == ["Tool said: sunny-0", "Tool said: sunny-0; sunny-1"]
    last = chat_peer.requests[-1].body["messages"]
    assert [m["role"] for m in last] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
        "assistant",
        "tool",
    ]
    assert chat_server.engine.counters["create.fast_path"] == 2


async def test_sdk_tool_loop_over_responses_upstream(
    responses_server: LiveServer, responses_peer: ResponsesPeer
) -> None:
    answers = await tool_loop(responses_server, turns=2)
    assert answers == ["Tool said: sunny-0", "Tool said: sunny-1"]
    last = responses_peer.requests[-1].body["input"]
    kinds = [i.get("role") or i["type"] for i in last]
    assert kinds == [
        "user",
        "function_call",
        "function_call_output",
        "assistant",
        "user",
        "function_call",
        "function_call_output",
    ]
