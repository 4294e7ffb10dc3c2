"""Reasoning through a ``tokens`` route, end to end with the openai SDK (REASON-1..REASON-5,
HARMONY-1..HARMONY-5): Qwen3-style ``<think>`` and gpt-oss harmony chains (reasoning, a tool
call, a final answer) over WebSocket and HTTP against the token peer speaking vLLM's token API.
Every turn is exact (each prompt extends the previous prompt and its sampled ids), reasoning
arrives as ``reasoning`` items with ``response.reasoning_text.*`` events and is counted in
``reasoning_tokens``, ``GET /v1/responses/{id}/tokens`` is the trajectory, reasoning items
given back as input are rendered, and ``exact``/``rerender`` differ as documented."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI

from engine.models.config import ConfigError, parse_config
from tests.support.server import LiveServer
from tests.support.tools import WEATHER
from tests.upstream.conftest import StartEngine
from tests.upstream.reasoning_peer import (
    HARMONY_SCRIPT,
    HarmonyPeer,
    harmony_router,
)
from tests.upstream.token_peer import TokenPeer, assert_exact, backend_of, tokens_router

CALL = json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}})
THINK_SCRIPT = [
    f"<think>\nThe user wants the weather.\n</think>\n\n<tool_call>\n{CALL}\n</tool_call>",
    "<think>\nThe tool said sunny.\n</think>\n\nIt is sunny in Paris.",
]


async def think_server(
    engine_for: StartEngine, peer: TokenPeer, tokenizer: Path, history: str = "exact"
) -> LiveServer:
    router = tokens_router(peer, tokenizer, "vllm", reasoning_parser="think", history=history)
    return await engine_for(router)


async def ws_chain(server: LiveServer) -> tuple[list[Any], list[str]]:
    """Weather? -> (reasoning, call) -> tool output -> (reasoning, answer), over the SDK's
    WebSocket; returns the two responses and the event types seen."""
    client = AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    seen: list[str] = []
    responses: list[Any] = []
    try:
        async with client.responses.connect() as conn:
            await conn.response.create(model="model-a", input="Weather?", tools=[WEATHER])
            responses.append(await _completed(conn, seen))
            call = responses[0].output[-1]
            output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
            await conn.response.create(
                model="model-a",
                input=[output],
                tools=[WEATHER],
                previous_response_id=responses[0].id,
            )
            responses.append(await _completed(conn, seen))
    finally:
        await client.close()
    return responses, seen


async def _completed(conn: Any, seen: list[str]) -> Any:
    async for event in conn:
        seen.append(event.type)
        if event.type == "response.completed":
            return event.response
        assert event.type not in ("error", "response.failed"), event


def assert_reasoning_chain(responses: list[Any], seen: list[str], streamed: int = 2) -> None:
    """The two responses' items and usage, and the events ``seen`` while ``streamed`` of them
    were streamed (the last ones): each streamed its reasoning and closed it once."""
    first, second = responses
    assert [item.type for item in first.output] == ["reasoning", "function_call"]
    assert first.output[0].content[0].text == "The user wants the weather."
    assert first.output[0].summary == []
    assert first.output[1].name == "get_weather"
    assert json.loads(first.output[1].arguments) == {"city": "Paris"}
    assert [item.type for item in second.output] == ["reasoning", "message"]
    assert second.output[0].content[0].text == "The tool said sunny."
    assert second.output_text == "It is sunny in Paris."
    for response in responses:
        details = response.usage.output_tokens_details
        assert 0 < details.reasoning_tokens < response.usage.output_tokens
    assert seen.count("response.reasoning_text.delta") >= 2 * streamed
    assert seen.count("response.reasoning_text.done") == streamed


async def trajectory(server: LiveServer, response_id: str) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{server.base_url}/responses/{response_id}/tokens") as resp,
    ):
        assert resp.status == 200, await resp.text()
        body: dict[str, Any] = await resp.json()
        return body


async def assert_trajectory(server: LiveServer, peer: TokenPeer, response_id: str) -> None:
    """The stored trajectory is the last prompt plus its sampled ids, exactly."""
    last = peer.turns[-1]
    stored = await trajectory(server, response_id)
    assert stored["token_ids"] == last.prompt + last.answer
    assert stored["sampled"][len(last.prompt) :] == [True] * len(last.answer)


# ----------------------------------------------------------------------------- think


async def test_think_chain_over_websocket_is_exact(
    engine_for: StartEngine, think_peer: TokenPeer, qwen3_dir: Path
) -> None:
    server = await think_server(engine_for, think_peer, qwen3_dir)
    think_peer.script.extend(THINK_SCRIPT)
    responses, seen = await ws_chain(server)
    assert_reasoning_chain(responses, seen)
    assert_exact(think_peer)
    await assert_trajectory(server, think_peer, responses[1].id)
    assert backend_of(server).stats["render.full"] == 1


async def test_think_chain_over_http_is_exact(
    engine_for: StartEngine, think_peer: TokenPeer, qwen3_dir: Path
) -> None:
    server = await think_server(engine_for, think_peer, qwen3_dir)
    think_peer.script.extend(THINK_SCRIPT)
    client = AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    try:
        first = await client.responses.create(model="model-a", input="Weather?", tools=[WEATHER])
        call = first.output[-1]
        output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
        seen: list[str] = []
        stream = await client.responses.create(
            model="model-a",
            input=[output],
            tools=[WEATHER],
            previous_response_id=first.id,
            stream=True,
        )
        second = None
        async for event in stream:
            seen.append(event.type)
            if event.type == "response.completed":
                second = event.response
    finally:
        await client.close()
    assert_reasoning_chain([first, second], seen, streamed=1)  # the second only
    assert_exact(think_peer)
    assert second is not None
    await assert_trajectory(server, think_peer, second.id)


async def test_replayed_reasoning_is_rendered(
    engine_for: StartEngine, think_peer: TokenPeer, qwen3_dir: Path
) -> None:
    """REASON-4: a client that resends the whole history (reasoning items included, as the
    SDK round-trips them) gets them rendered where the template puts thinking."""
    server = await think_server(engine_for, think_peer, qwen3_dir)
    think_peer.script.extend(THINK_SCRIPT)
    client = AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    try:
        first = await client.responses.create(model="model-a", input="Weather?", tools=[WEATHER])
        call = first.output[-1]
        history = [
            {"role": "user", "content": "Weather?"},
            *[item.model_dump(exclude_none=True) for item in first.output],
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
        ]
        second = await client.responses.create(model="model-a", input=history, tools=[WEATHER])
    finally:
        await client.close()
    assert second.output_text == "It is sunny in Paris."
    prompt = think_peer.text(think_peer.turns[1].prompt)
    assert "<think>\nThe user wants the weather.\n</think>\n\n<tool_call>" in prompt
    # The stateless render equals what was sampled as text; its ids are the canonical
    # tokenization, not the peer's (it samples text a character at a time, TOK-42).
    turn1, turn2 = think_peer.turns
    sampled = think_peer.text(turn1.prompt + turn1.answer)
    assert think_peer.text(turn2.prompt).startswith(sampled)


@pytest.mark.parametrize("history", ["exact", "rerender"])
async def test_earlier_thinking_exact_or_rerendered(
    engine_for: StartEngine, think_peer: TokenPeer, qwen3_dir: Path, history: str
) -> None:
    """A new user turn: Qwen3's template drops earlier thinking when it renders the history.
    ``exact`` keeps the sampled ids (the prompt extends the last one); ``rerender`` renders the
    conversation afresh, without the earlier thinking (REASON-5)."""
    server = await think_server(engine_for, think_peer, qwen3_dir, history)
    think_peer.script.extend(["<think>\nHello back.\n</think>\n\nHi!", "Fine."])
    client = AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    try:
        first = await client.responses.create(model="model-a", input="Hi")
        await client.responses.create(
            model="model-a", input="How are you?", previous_response_id=first.id
        )
    finally:
        await client.close()
    second_prompt = think_peer.text(think_peer.turns[1].prompt)
    if history == "exact":
        assert_exact(think_peer)
        assert "<think>\nHello back.\n</think>" in second_prompt
    else:
        assert think_peer.extends(1) is None
        assert "Hello back." not in second_prompt
        assert "<|im_start|>assistant\nHi!<|im_end|>" in second_prompt


# ----------------------------------------------------------------------------- harmony


async def test_harmony_chain_over_websocket_is_exact(
    engine_for: StartEngine, harmony_peer: HarmonyPeer
) -> None:
    server = await engine_for(harmony_router(harmony_peer))
    harmony_peer.script.extend(HARMONY_SCRIPT[:2])
    responses, seen = await ws_chain(server)
    assert_reasoning_chain(responses, seen)
    assert_exact(harmony_peer)
    await assert_trajectory(server, harmony_peer, responses[1].id)
    first_prompt = harmony_peer.text(harmony_peer.turns[0].prompt)
    assert first_prompt.startswith("<|start|>system<|message|>")
    assert "type get_weather = " in first_prompt  # the function tool, in harmony's namespace
    assert first_prompt.endswith("<|start|>user<|message|>Weather?<|end|><|start|>assistant")
    second_prompt = harmony_peer.text(harmony_peer.turns[1].prompt)
    assert second_prompt.endswith(
        "<|call|><|start|>functions.get_weather to=assistant<|channel|>commentary"
        "<|message|>sunny<|end|><|start|>assistant"
    )


@pytest.mark.parametrize("history", ["exact", "rerender"])
async def test_harmony_chain_over_http(
    engine_for: StartEngine, harmony_peer: HarmonyPeer, history: str
) -> None:
    """Three turns over HTTP ``previous_response_id``: exact keeps every sampled id (the
    analysis messages too); rerender lets harmony render the history, which drops analysis
    before a final answer (HARMONY-5)."""
    server = await engine_for(harmony_router(harmony_peer, history=history))
    harmony_peer.script.extend(HARMONY_SCRIPT)
    client = AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    try:
        first = await client.responses.create(model="model-a", input="Weather?", tools=[WEATHER])
        call = first.output[-1]
        output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
        second = await client.responses.create(
            model="model-a", input=[output], tools=[WEATHER], previous_response_id=first.id
        )
        third = await client.responses.create(
            model="model-a", input="Thanks", tools=[WEATHER], previous_response_id=second.id
        )
    finally:
        await client.close()
    assert [item.type for item in first.output] == ["reasoning", "function_call"]
    assert second.output_text == "It is sunny in Paris."
    assert third.output_text == "You are welcome."
    assert third.usage.output_tokens_details.reasoning_tokens == 0
    last_prompt = harmony_peer.text(harmony_peer.turns[2].prompt)
    if history == "exact":
        assert_exact(harmony_peer)
        await assert_trajectory(server, harmony_peer, third.id)
        assert "The tool said sunny." in last_prompt
    else:
        assert harmony_peer.extends(2) is None
        assert "The tool said sunny." not in last_prompt
        assert "It is sunny in Paris.<|end|><|start|>user<|message|>Thanks" in last_prompt


async def test_harmony_replayed_reasoning_is_an_analysis_message(
    engine_for: StartEngine, harmony_peer: HarmonyPeer
) -> None:
    """REASON-4, HARMONY-2: a stateless create with the SDK's round-tripped items renders the
    reasoning as ``analysis`` and the call as a ``commentary`` call, before the tool result.
    The hydration cache is off, so the resend is rendered, not continued (COMPAT-7)."""
    server = await engine_for(harmony_router(harmony_peer), hydration_cache_bytes=0)
    harmony_peer.script.extend(HARMONY_SCRIPT[:2])
    client = AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    try:
        first = await client.responses.create(model="model-a", input="Weather?", tools=[WEATHER])
        call = first.output[-1]
        history = [
            {"role": "user", "content": "Weather?"},
            *[item.model_dump(exclude_none=True) for item in first.output],
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
        ]
        second = await client.responses.create(model="model-a", input=history, tools=[WEATHER])
    finally:
        await client.close()
    assert second.output_text == "It is sunny in Paris."
    prompt = harmony_peer.text(harmony_peer.turns[1].prompt)
    assert prompt.endswith(
        "<|start|>user<|message|>Weather?<|end|>"
        "<|start|>assistant<|channel|>analysis<|message|>The user wants the weather.<|end|>"
        "<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json"
        '<|message|>{"city": "Paris"}<|call|>'
        "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>sunny<|end|>"
        "<|start|>assistant"
    )
    assert backend_of(server).stats["render.full"] == 2


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        ({"template": "harmony", "tokenizer": "/x"}, "harmony brings its own encoding"),
        ({"template": "harmony", "reasoning_parser": "think"}, "harmony reads its own channels"),
        ({"reasoning_parser": "harmony", "tokenizer": "/x"}, 'needs template = "harmony"'),
        ({}, "tokenizer: required key is missing"),
        ({"tokenizer": "/x", "reasoning_parser": "deepthink"}, "reasoning_parser"),
    ],
)
def test_route_keys_are_checked(extra: dict[str, Any], problem: str) -> None:
    route = {"backend": "tokens", "api": "vllm", "base_url": "http://127.0.0.1:9", **extra}
    with pytest.raises(ConfigError) as caught:
        parse_config({"models": {"m": route}})
    assert problem in str(caught.value)
    assert str(caught.value).startswith("config: models.m")
