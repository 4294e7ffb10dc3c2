"""Compaction and input token counts with the real server and the openai SDK, over HTTP and in a
WebSocket chain (COMPACT-1..COMPACT-6, TOKENS-1). Every frame and JSON body is also checked by
both oracles (``tests/conftest.py``)."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI, BadRequestError
from openai.resources.responses.responses import AsyncResponsesConnection
from openai.types.responses import CompactedResponse, ResponseCompactionItem, ResponseUsage

from engine.conversation.compaction import unseal
from tests.support.server import LiveServer
from tests.support.tools import WEATHER

MODEL = "gpt-x"
TERMINAL = {"response.completed", "response.failed", "response.incomplete"}
LONG = " ".join(f"word{n}" for n in range(300))  # ~600 tokens of assistant or tool text


def conversation() -> list[dict[str, Any]]:
    """A finished exchange whose bulk is the model's own text and a long tool result."""
    return [
        {"role": "user", "content": "Tell me about Lima."},
        {"type": "function_call", "call_id": "call_a", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_a", "output": LONG},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": LONG}],
        },
        {"role": "user", "content": "Thanks. What about Quito?"},
    ]


async def compact_raw(client: AsyncOpenAI, **params: Any) -> tuple[CompactedResponse, list[Any]]:
    """``client.responses.compact``; also the output as sent, to use as the next input (the
    SDK types kept user messages as assistant output messages, COMPACT-1)."""
    raw = await client.responses.with_raw_response.compact(model=MODEL, **params)
    return raw.parse(), json.loads(raw.text)["output"]


async def count(client: AsyncOpenAI, **params: Any) -> int:
    result = await client.responses.input_tokens.count(model=MODEL, **params)
    assert result.object == "response.input_tokens"
    return result.input_tokens


async def ws_turn(conn: AsyncResponsesConnection, **params: Any) -> list[dict[str, Any]]:
    await conn.send_raw(json.dumps({"type": "response.create", "model": MODEL, **params}))
    frames: list[dict[str, Any]] = []
    while not frames or frames[-1]["type"] not in TERMINAL | {"error"}:
        frames.append(json.loads(await conn.recv_bytes()))
    return frames


# ----------------------------------------------------------------------------- input_tokens


async def test_input_tokens_equals_the_create_prompt(client: AsyncOpenAI) -> None:
    """TOKENS-1: the count is the prompt a create with the same body samples from (header with
    instructions and tools, every item), with the SDK's ``input_tokens.count``."""
    body: dict[str, Any] = {
        "input": conversation(),
        "instructions": "Be brief.",
        "tools": [WEATHER],
    }
    counted = await count(client, **body)
    created = await client.responses.create(model=MODEL, store=False, **body)
    assert created.usage is not None
    assert counted == created.usage.input_tokens
    assert counted > await count(client, input=conversation())  # the header counts


async def test_input_tokens_in_a_websocket_chain(client: AsyncOpenAI) -> None:
    """TOKENS-1: with ``previous_response_id`` (a stored response of a WebSocket chain) the count
    is the continuation's prompt."""
    async with client.responses.connect() as conn:
        first = await ws_turn(conn, input="Weather in Paris?", tools=[WEATHER])
        call = first[-1]["response"]["output"][0]
        follow = [{"type": "function_call_output", "call_id": call["call_id"], "output": "mild"}]
        counted = await count(
            client, previous_response_id=first[-1]["response"]["id"], input=follow, tools=[WEATHER]
        )
        second = await ws_turn(
            conn, previous_response_id=first[-1]["response"]["id"], input=follow, tools=[WEATHER]
        )
    assert second[-1]["type"] == "response.completed"
    assert counted == second[-1]["response"]["usage"]["input_tokens"]


async def test_input_tokens_errors(client: AsyncOpenAI) -> None:
    """TOKENS-1: request errors are those of a create."""
    with pytest.raises(BadRequestError) as missing:
        await count(client, previous_response_id="resp_missing", input="x")
    assert missing.value.code == "previous_response_not_found"
    with pytest.raises(BadRequestError) as bad:
        await count(client, input=[{"type": "function_call_output", "call_id": "nope"}])
    assert bad.value.code == "missing_required_parameter"
    assert bad.value.param == "input[0].output"


# ----------------------------------------------------------------------------- /compact


async def test_compact_with_the_sdk(client: AsyncOpenAI) -> None:
    """COMPACT-1, COMPACT-2: client messages are kept, the rest becomes one ``compaction`` item
    whose sealed summary is a deterministic digest; the window renders fewer tokens and a create
    continues from it."""
    compacted, output = await compact_raw(client, input=conversation())
    assert compacted.object == "response.compaction"
    assert [o["type"] for o in output] == ["message", "compaction", "message"]
    assert [o["content"][0]["text"] for o in (output[0], output[2])] == [
        "Tell me about Lima.",
        "Thanks. What about Quito?",
    ]
    item = ResponseCompactionItem.model_validate(output[1])
    assert item.id.startswith("cmp_")
    ResponseUsage.model_validate(compacted.usage.model_dump())
    before = await count(client, input=conversation())
    assert compacted.usage.input_tokens == before
    summary = unseal(item.encrypted_content)
    assert summary is not None and summary.startswith("Summary of 3 earlier items:")
    assert "- called get_weather({})" in summary and "- tool result: word0 word1" in summary
    _, again = await compact_raw(client, input=conversation())
    assert again[1]["encrypted_content"] == item.encrypted_content  # deterministic
    after = await count(client, input=output)
    assert after < before / 4
    follow = [*output, {"role": "user", "content": "And Cusco?"}]
    answer = await client.responses.create(model=MODEL, input=follow, store=False)
    assert answer.output_text == "This is a simulated answer to: And Cusco?"
    assert answer.usage is not None and answer.usage.input_tokens == await count(
        client, input=follow
    )


async def test_compact_previous_response_id(client: AsyncOpenAI) -> None:
    """COMPACT-1: a stored conversation is compacted from ``previous_response_id`` (with new
    input after it)."""
    first = await client.responses.create(model=MODEL, input=conversation())
    _, output = await compact_raw(client, previous_response_id=first.id, input="One more question.")
    texts = [o["content"][0]["text"] for o in output if o["type"] == "message"]
    assert texts == ["Tell me about Lima.", "Thanks. What about Quito?", "One more question."]
    assert [o["type"] for o in output] == ["message", "message", "compaction", "message"]
    summary = unseal(output[2]["encrypted_content"])
    assert summary is not None and "- assistant: This is a simulated answer to: Thanks." in summary
    with pytest.raises(BadRequestError) as missing:
        await compact_raw(client, previous_response_id="resp_missing")
    assert missing.value.code == "previous_response_not_found"


async def test_compact_without_model_is_missing_required_parameter(server: LiveServer) -> None:
    """COMPACT-1: ``model`` is required by the Open Responses document: 400
    ``missing_required_parameter``, param ``model``."""
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{server.base_url}/responses/compact", json={"input": "hi"}) as resp,
    ):
        body = await resp.json()
    assert resp.status == 400
    assert body["error"] == {
        "type": "invalid_request_error",
        "code": "missing_required_parameter",
        "message": "Missing required parameter: 'model'.",
        "param": "model",
    }


# ----------------------------------------------------------------------------- context_management


def _threshold(tokens: int) -> list[dict[str, Any]]:
    return [{"type": "compaction", "compact_threshold": tokens}]


async def test_context_management_over_http_and_pruning(client: AsyncOpenAI) -> None:
    """COMPACT-3, COMPACT-4 over HTTP: past the threshold the response's first output item is
    the compaction, the model answers from the compacted window, and a stateless continuation
    that sends everything back is pruned to the window."""
    first = await client.responses.create(
        model=MODEL, input=conversation(), context_management=_threshold(100), store=False
    )
    assert [o.type for o in first.output] == ["compaction", "message"]
    assert first.output_text == "This is a simulated answer to: Thanks. What about Quito?"
    history = [*conversation(), *[o.model_dump(exclude_none=True) for o in first.output]]
    follow = [*history, {"role": "user", "content": "And Cusco?"}]
    pruned = await count(client, input=follow)
    without = [i for i in follow if i.get("type") != "compaction"]
    assert pruned < (await count(client, input=without)) / 4
    second = await client.responses.create(model=MODEL, input=follow, store=False)
    assert second.output_text == "This is a simulated answer to: And Cusco?"
    below = await client.responses.create(
        model=MODEL, input="short", context_management=_threshold(10_000), store=False
    )
    assert [o.type for o in below.output] == ["message"]


async def test_context_management_in_a_websocket_chain(
    client: AsyncOpenAI, server: LiveServer
) -> None:
    """COMPACT-3 in a WebSocket chain: the same tool-using chain run twice on one socket, with and
    without ``context_management``. The compacted chain answers exactly as the full one, and its
    stored context renders fewer tokens."""
    turns = [
        {"input": "Weather in Lima?"},
        {"output": LONG},
        {"input": "Thanks. And in Quito?"},
        {"output": "cold"},
    ]
    results: dict[bool, list[list[dict[str, Any]]]] = {}
    async with client.responses.connect() as conn:
        for managed in (False, True):
            extra = {"context_management": _threshold(300)} if managed else {}
            chain: list[list[dict[str, Any]]] = []
            previous: str | None = None
            for turn in turns:
                if "output" in turn:
                    call = chain[-1][-1]["response"]["output"][-1]
                    item = {"type": "function_call_output", "call_id": call["call_id"]}
                    step_input: Any = [{**item, "output": turn["output"]}]
                else:
                    step_input = turn["input"]
                frames = await ws_turn(
                    conn,
                    input=step_input,
                    tools=[WEATHER],
                    previous_response_id=previous,
                    **extra,
                )
                assert frames[-1]["type"] == "response.completed", frames[-1]
                previous = frames[-1]["response"]["id"]
                chain.append(frames)
            results[managed] = chain

    def visible(frames: list[dict[str, Any]]) -> list[Any]:
        out = frames[-1]["response"]["output"]
        return [
            (o["type"], o.get("name"), o.get("arguments"), o.get("content"))
            for o in out
            if o["type"] != "compaction"
        ]

    plain, managed_chain = results[False], results[True]
    assert [visible(f) for f in managed_chain] == [visible(f) for f in plain]
    kinds = [[o["type"] for o in f[-1]["response"]["output"]] for f in managed_chain]
    assert kinds == [
        ["function_call"],
        ["message"],  # over the threshold, but the tool round is kept: nothing to replace
        ["compaction", "function_call"],  # at the next question the round is replaced
        ["message"],  # the compacted context is under the threshold
    ]
    assert server.engine.counters["compaction.auto"] == 1
    added = [f for f in managed_chain[2] if f["type"] == "response.output_item.added"]
    assert added[0]["item"]["type"] == "compaction" and added[0]["output_index"] == 0
    probe = [{"role": "user", "content": "?"}]
    compacted = await count(
        client, previous_response_id=managed_chain[-1][-1]["response"]["id"], input=probe
    )
    full = await count(client, previous_response_id=plain[-1][-1]["response"]["id"], input=probe)
    assert compacted < full


async def test_context_management_invalid(client: AsyncOpenAI) -> None:
    """COMPACT-3: a malformed ``context_management`` is a request error with its path."""
    with pytest.raises(BadRequestError) as bad:
        await client.responses.create(
            model=MODEL,
            input="x",
            context_management=[{"type": "compaction", "compact_threshold": -1}],
        )
    assert bad.value.code == "invalid_value"
    assert bad.value.param == "context_management[0].compact_threshold"


async def test_compact_mid_websocket_chain_then_continue_on_the_socket(client: AsyncOpenAI) -> None:
    """COMPACT-1 in a WebSocket chain, as Codex's remote compaction does it: the chain's stored
    response is compacted over HTTP, and a new chain on the same socket starts from the window
    (and is then continued with ``previous_response_id`` as usual)."""
    async with client.responses.connect() as conn:
        first = await ws_turn(conn, input=conversation(), tools=[WEATHER])
        call = first[-1]["response"]["output"][-1]
        done = [{"type": "function_call_output", "call_id": call["call_id"], "output": LONG}]
        second = await ws_turn(
            conn, previous_response_id=first[-1]["response"]["id"], input=done, tools=[WEATHER]
        )
        _, window = await compact_raw(client, previous_response_id=second[-1]["response"]["id"])
        assert [o["type"] for o in window] == ["message", "message", "compaction"]
        fresh = await ws_turn(
            conn, input=[*window, {"role": "user", "content": "Cusco?"}], tools=[WEATHER]
        )
        (fresh_call,) = fresh[-1]["response"]["output"]
        assert json.loads(fresh_call["arguments"]) == {"city": "Cusco"}
        answer = [
            {"type": "function_call_output", "call_id": fresh_call["call_id"], "output": "dry"}
        ]
        last = await ws_turn(
            conn, previous_response_id=fresh[-1]["response"]["id"], input=answer, tools=[WEATHER]
        )
    assert (
        last[-1]["response"]["output"][0]["content"][0]["text"] == "Based on the tool results: dry"
    )
    full = second[-1]["response"]["usage"]["input_tokens"]
    assert fresh[-1]["response"]["usage"]["input_tokens"] < full / 4
