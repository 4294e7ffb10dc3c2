"""Sampling parameters out of their documented ranges are a 400 naming the param (VAL-10..VAL-12),
and an input of any size up to the request limit tokenizes instead of failing (TOK-50..TOK-52),
over HTTP and WebSocket, with the openai SDK as the client."""

from __future__ import annotations

import random
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

from tests.support.fixtures import sdk_client
from tests.support.server import LiveServer

OUT_OF_RANGE = [
    ({"temperature": 1e308}, "temperature", "decimal_above_max_value"),
    ({"temperature": -0.5}, "temperature", "decimal_below_min_value"),
    ({"top_p": 1.5}, "top_p", "decimal_above_max_value"),
    ({"top_p": -1}, "top_p", "decimal_below_min_value"),
    ({"top_logprobs": 21}, "top_logprobs", "integer_above_max_value"),
    ({"top_logprobs": -1}, "top_logprobs", "integer_below_min_value"),
    ({"max_output_tokens": -1}, "max_output_tokens", "integer_below_min_value"),
    ({"max_output_tokens": 0}, "max_output_tokens", "integer_below_min_value"),
]
AT_THE_EDGES: list[dict[str, Any]] = [
    {"temperature": 0, "top_p": 0, "top_logprobs": 0, "max_output_tokens": 1},
    {"temperature": 2, "top_p": 1, "top_logprobs": 20, "max_output_tokens": 10**9},
]


async def _ws_events(client: AsyncOpenAI, **params: Any) -> list[Any]:
    events: list[Any] = []
    async with client.responses.connect() as conn:
        await conn.response.create(model="sim", store=False, **params)
        async for event in conn:
            events.append(event)
            if event.type in ("error", "response.completed", "response.incomplete"):
                break
    return events


@pytest.mark.parametrize(("params", "param", "code"), OUT_OF_RANGE)
async def test_out_of_range_is_a_400_naming_the_param(
    server: LiveServer, params: dict[str, Any], param: str, code: str
) -> None:
    async with sdk_client(server) as client:
        with pytest.raises(openai.BadRequestError) as refused:
            await client.responses.create(model="sim", input="hi", **params)
        assert (refused.value.param, refused.value.code) == (param, code)
        assert f"Invalid '{param}':" in refused.value.message
        [error] = await _ws_events(client, input="hi", **params)
    assert error.type == "error"
    assert (error.error.param, error.error.code) == (param, code)
    assert not server.engine.hydrated  # no response was made


@pytest.mark.parametrize("params", AT_THE_EDGES)
async def test_the_edges_of_each_range_run(server: LiveServer, params: dict[str, Any]) -> None:
    async with sdk_client(server) as client:
        response = await client.responses.create(model="sim", input="hi", **params)
        assert response.status in ("completed", "incomplete")
        assert response.temperature == params["temperature"]
        events = await _ws_events(client, input="hi", **params)
    assert events[-1].type in ("response.completed", "response.incomplete")


def _word(chars: int) -> str:
    return "".join(random.Random(chars).choice("abcdefghij") for _ in range(chars))


def _lines(chars: int) -> str:
    line = "    result = handler(request)  # it's 42 東京\n"
    return (line * (chars // len(line) + 1))[:chars]


BIG_INPUTS = [
    pytest.param({"input": [{"type": "message", "role": "user", "content": _lines(1_000_000)}]},
                 id="1M-char-item"),
    pytest.param({"input": "hi", "instructions": _lines(5_000_000)}, id="5MB-instructions"),
    pytest.param({"input": _word(2_000_000)}, id="2MB-word"),
]  # fmt: skip


@pytest.mark.parametrize("params", BIG_INPUTS)
async def test_big_inputs_tokenize_over_http_and_ws(
    server: LiveServer, params: dict[str, Any]
) -> None:
    """What answered 500 ``server_error`` before (issue 24): now a response whose input tokens
    are the count of the whole text. The answer is capped: the simulator's answer grows with
    its input, and the input is what is tested here."""
    capped = {"max_output_tokens": 16, **params}
    async with sdk_client(server) as client:
        counted = await client.responses.input_tokens.count(model="sim", **params)
        response = await client.responses.create(model="sim", store=False, **capped)
        assert response.status in ("completed", "incomplete")
        assert response.usage is not None
        assert response.usage.input_tokens == counted.input_tokens > 100_000
        events = await _ws_events(client, **capped)
    assert events[-1].type in ("response.completed", "response.incomplete")
    assert events[-1].response.usage.input_tokens == counted.input_tokens
