"""Upstreams checked, not trusted (TOK-32, TOK-33): SGLang's cumulative and incremental
stream shapes both give the exact ids (detected, or named in the route), and a turn whose ids
received differ from the server's own count fails with ``upstream_token_mismatch`` and a
counter, never leaving a silently short trajectory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from engine.models.tokens.servers.llamacpp import LlamacppReader
from tests.support.tools import WEATHER
from tests.upstream.conftest import StartEngine
from tests.upstream.token_peer import TokenPeer, assert_exact, backend_of, tokens_router


async def tool_round(client: AsyncOpenAI) -> str:
    first = await client.responses.create(model="model-a", input="Weather?", tools=[WEATHER])
    call = first.output[-1]
    assert call.type == "function_call" and call.arguments == '{"city": "Paris"}', first.output
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "sun"}
    second = await client.responses.create(
        model="model-a", previous_response_id=first.id, input=[output], tools=[WEATHER]
    )
    return second.output_text


@pytest.mark.parametrize(
    ("incremental", "shape"),
    [(False, "auto"), (True, "auto"), (True, "incremental"), (False, "cumulative")],
)
async def test_sglang_stream_shapes_give_the_exact_ids(
    incremental: bool,
    shape: str,
    token_peer: TokenPeer,
    tokenizer_dir: Path,
    engine_for: StartEngine,
) -> None:
    token_peer.sglang_incremental = incremental
    router = tokens_router(token_peer, tokenizer_dir, "sglang", sglang_stream=shape)
    server = await engine_for(router)
    client = AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    try:
        assert await tool_round(client) == "Tool said: sun"
    finally:
        await client.close()
    assert_exact(token_peer)
    assert backend_of(server).stats["sampled_ids"] == sum(len(t.answer) for t in token_peer.turns)


async def _failed_over_ws(server: Any) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.ws_connect(server.ws_url) as ws:
        create = {"type": "response.create", "model": "model-a", "input": "Hello"}
        await ws.send_json(create)
        while True:
            frame: dict[str, Any] = await ws.receive_json(timeout=10)
            assert frame["type"] not in ("response.completed", "error"), frame
            if frame["type"] == "response.failed":
                return frame


async def _metric(server: Any, event: str) -> float:
    async with aiohttp.ClientSession() as http:
        root = server.base_url.removesuffix("/v1")
        async with http.get(f"{root}/metrics") as resp:
            text = await resp.text()
    for line in text.splitlines():
        if line.startswith(f'rollout_events_total{{event="{event}"}}'):
            return float(line.split()[-1])
    return 0.0


LOSSY = [("vllm", False), ("sglang", False), ("sglang", True), ("llamacpp", False)]


@pytest.mark.parametrize(("api", "incremental"), LOSSY)
async def test_a_short_stream_fails_with_its_code_and_is_counted(
    api: str,
    incremental: bool,
    token_peer: TokenPeer,
    tokenizer_dir: Path,
    engine_for: StartEngine,
) -> None:
    token_peer.lose = 1
    token_peer.sglang_incremental = incremental
    server = await engine_for(tokens_router(token_peer, tokenizer_dir, api))
    failed = await _failed_over_ws(server)
    error = failed["response"]["error"]
    assert error["code"] == "server_error"  # the SDK's ResponseError.code is a closed enum
    assert error["message"].startswith("upstream_token_mismatch: ")
    client = AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    try:
        with pytest.raises(openai.InternalServerError) as caught:
            await client.responses.create(model="model-a", input="Hello")
    finally:
        await client.close()
    body: Any = caught.value.body
    assert body["code"] == "upstream_token_mismatch", body
    assert caught.value.response.headers["x-should-retry"] == "false"
    assert await _metric(server, f"tokens.count_mismatch.{api}") == 2
    assert backend_of(server).stats["sampled_ids"] == 0  # nothing short joined a trajectory


async def test_a_wrongly_named_shape_is_caught_not_trusted(
    token_peer: TokenPeer, tokenizer_dir: Path, engine_for: StartEngine
) -> None:
    """An incremental server behind a route that says ``cumulative``: the ids would be cut
    short; the server's count catches it."""
    token_peer.sglang_incremental = True
    router = tokens_router(token_peer, tokenizer_dir, "sglang", sglang_stream="cumulative")
    server = await engine_for(router)
    failed = await _failed_over_ws(server)
    assert failed["response"]["error"]["message"].startswith("upstream_token_mismatch: ")


async def test_a_lossless_peer_is_not_flagged(
    token_peer: TokenPeer, tokenizer_dir: Path, engine_for: StartEngine
) -> None:
    """The check can pass: the same lossy path with nothing lost completes."""
    token_peer.lose = 0
    server = await engine_for(tokens_router(token_peer, tokenizer_dir, "llamacpp"))
    client = AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    try:
        response = await client.responses.create(model="model-a", input="Hello")
    finally:
        await client.close()
    assert response.output_text == "Echo: Hello"
    assert await _metric(server, "tokens.count_mismatch.llamacpp") == 0


def test_llamacpp_whole_answer_aligns_the_probabilities_it_kept() -> None:
    """TOK-44: llama.cpp answers whole by default; it keeps no probability for a token that
    ends inside a UTF-8 character, so the ids it skipped get None, the rest their own."""
    reader = LlamacppReader("llamacpp")
    chunk = {
        "tokens": [5, 7, 7, 9],
        "completion_probabilities": [
            {"id": 5, "logprob": -0.5},
            {"id": 7, "logprob": -0.7},
            {"id": 9, "logprob": -0.9},
        ],
        "stop": True,
        "stop_type": "eos",
        "tokens_predicted": 4,
        "tokens_evaluated": 3,
    }
    step = reader.read(json.dumps(chunk))
    assert step.ids == [5, 7, 7, 9] and step.ended
    assert step.logprobs == [-0.5, -0.7, None, -0.9]
    reader.check(step.completion_tokens)  # every id arrived: no mismatch
