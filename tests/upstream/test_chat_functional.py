"""Our server in front of the chat peer: HTTP, the WebSocket compat fast path and the
experimental append mode send the right full context upstream, per turn (UP-CHAT-*, UP-1..6)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from engine.conversation.tokens import count
from tests.support.http import post
from tests.support.server import LiveServer
from tests.support.tools import WEATHER
from tests.support.ws import read_until
from tests.upstream.conftest import StartEngine, router_for
from tests.upstream.peer import SECRET, Call, ChatPeer, Reply

Event = dict[str, Any]


def call_msg(call_id: str, city: str) -> Event:
    arguments = json.dumps({"city": city}, separators=(",", ":"))
    fn = {"name": "get_weather", "arguments": arguments}
    return {"id": call_id, "type": "function", "function": fn}


async def test_http_text_and_usage_from_the_upstream(
    chat_server: LiveServer, chat_peer: ChatPeer
) -> None:
    status, body = await post(chat_server, model="model-a", input="hi", store=False)
    assert status == 200 and body["status"] == "completed"
    assert body["output"][0]["content"][0]["text"] == "Echo: hi"
    assert body["usage"]["output_tokens"] == 7  # the upstream's completion_tokens
    assert chat_peer.last["model"] == "up-model"
    assert chat_peer.last["messages"] == [{"role": "user", "content": "hi"}]


async def test_aliases_default_and_sim_routes(chat_server: LiveServer, chat_peer: ChatPeer) -> None:
    for model in ("gpt-up", "anything-else"):
        status, body = await post(chat_server, model=model, input="hi", store=False)
        assert status == 200 and body["model"] == model
    assert len(chat_peer.requests) == 2
    status, body = await post(chat_server, model="sim", input="hi", store=False)
    assert body["output"][0]["content"][0]["text"].startswith("This is a simulated answer")
    assert len(chat_peer.requests) == 2


async def test_models_lists_names_aliases_and_default(chat_server: LiveServer) -> None:
    async with aiohttp.ClientSession() as http, http.get(f"{chat_server.base_url}/models") as r:
        data = (await r.json())["data"]
    owners = {m["id"]: m["owned_by"] for m in data}
    assert owners == {"model-a": "chat", "gpt-up": "chat", "sim": "sim"}


async def test_compat_fast_path_sends_the_full_context(
    chat_server: LiveServer, chat_peer: ChatPeer
) -> None:
    chat_peer.queue(
        Reply(text="Let me look.", calls=[Call("get_weather", '{"city":"Paris"}', "call_p")]),
        Reply(text="It is sunny."),
    )
    common = {"model": "model-a", "tools": [WEATHER], "instructions": "Be brief.", "store": False}
    async with aiohttp.ClientSession() as http, http.ws_connect(chat_server.ws_url) as ws:
        await ws.send_json(
            {
                "type": "response.create",
                "input": "Weather in Paris?",
                "tool_choice": "required",
                "parallel_tool_calls": False,
                "max_output_tokens": 300,
                **common,
            }
        )
        first = (await read_until(ws, "response.completed"))[-1]
        call = first["response"]["output"][-1]
        assert call["type"] == "function_call" and call["call_id"] == "call_p"
        await ws.send_json(
            {
                "type": "response.create",
                "previous_response_id": first["response"]["id"],
                "input": [{"type": "function_call_output", "call_id": "call_p", "output": "sunny"}],
                **common,
            }
        )
        second = (await read_until(ws, "response.completed"))[-1]
    assert second["response"]["output"][0]["content"][0]["text"] == "It is sunny."
    assert chat_server.engine.counters["create.fast_path"] == 1
    turn1, turn2 = (r.body for r in chat_peer.requests)
    assert turn1["tool_choice"] == "required" and turn1["parallel_tool_calls"] is False
    assert turn1["max_tokens"] == 300 and "max_tokens" not in turn2
    assert turn1["tools"][0]["function"]["name"] == "get_weather"
    assert turn2["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [call_msg("call_p", "Paris")],
        },
        {"role": "tool", "tool_call_id": "call_p", "content": "sunny"},
    ]
    assert turn2["tool_choice"] == "auto"


async def test_append_mode_two_parallel_calls_full_context(
    chat_server: LiveServer, chat_peer: ChatPeer
) -> None:
    calls = [
        Call("get_weather", '{"city":"Paris"}', "call_1"),
        Call("get_weather", '{"city":"Rome"}', "call_2"),
    ]
    chat_peer.queue(Reply(calls=calls), Reply(text="Paris sunny, Rome rain."))
    async with aiohttp.ClientSession() as http, http.ws_connect(chat_server.ws_url) as ws:
        await ws.send_json(
            {
                "type": "response.create",
                "rollout_mode": "append",
                "model": "model-a",
                "input": "Weather in Paris and Rome?",
                "tools": [WEATHER],
                "store": False,
            }
        )
        done = (await read_until(ws, "response.done"))[-1]
        pending = [c["call_id"] for c in done["pending_calls"]]
        assert pending == ["call_1", "call_2"]
        outputs = [
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            {"type": "function_call_output", "call_id": "call_2", "output": "rain"},
        ]
        response_id = done["response"]["id"]
        await ws.send_json(
            {"type": "response.append", "response_id": response_id, "input": outputs}
        )
        final = (await read_until(ws, "response.completed"))[-1]
    assert final["response"]["id"] == response_id  # one response for the whole rollout
    assert chat_peer.requests[1].body["messages"] == [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [call_msg("call_1", "Paris"), call_msg("call_2", "Rome")],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "rain"},
    ]


async def test_finish_length_is_incomplete(chat_server: LiveServer, chat_peer: ChatPeer) -> None:
    chat_peer.queue(Reply(text="Once upon a", finish="length"))
    status, body = await post(chat_server, model="model-a", input="story", max_output_tokens=3)
    assert status == 200 and body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert chat_peer.last["max_tokens"] == 3


async def test_usage_falls_back_to_our_tokenizer(
    chat_server: LiveServer, chat_peer: ChatPeer
) -> None:
    chat_peer.queue(Reply(text="Counted by the engine itself.", usage=None))
    _, body = await post(chat_server, model="model-a", input="hi", store=False)
    assert body["usage"]["output_tokens"] == count("Counted by the engine itself.")
    assert body["usage"]["estimated"] is True  # USE-3: the response says so
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{chat_server.port}/debug/stats") as r,
    ):
        stats = await r.json()
    assert stats["backends"]["gpt-up"]["usage_estimated"] == 1


@pytest.mark.parametrize("status", [400, 401])
async def test_upstream_4xx_fails_the_response_without_secrets(
    chat_server: LiveServer, chat_peer: ChatPeer, status: int
) -> None:
    body = {"error": {"message": f"Incorrect API key provided: {SECRET}"}}
    chat_peer.queue(Reply(status=status, error_body=body))
    async with aiohttp.ClientSession() as http, http.ws_connect(chat_server.ws_url) as ws:
        await ws.send_json({"type": "response.create", "model": "model-a", "input": "hi"})
        events = await read_until(ws, "response.failed", "error")
    assert SECRET not in json.dumps(events) and "sk-test" not in json.dumps(events)


async def test_upstream_4xx_reaches_the_client_with_its_status(
    chat_server: LiveServer, chat_peer: ChatPeer
) -> None:
    chat_peer.queue(Reply(status=400, error_body={"error": {"message": "context too long"}}))
    status, body = await post(chat_server, model="model-a", input="hi")
    assert status == 400 and "context too long" in body["error"]["message"]


async def test_temperature_and_top_p_reach_the_upstream(
    chat_server: LiveServer, chat_peer: ChatPeer
) -> None:
    await post(chat_server, model="model-a", input="hi", temperature=0.3, top_p=0.5)
    assert chat_peer.last["temperature"] == 0.3 and chat_peer.last["top_p"] == 0.5


async def test_upstream_5xx_is_response_failed_server_error(
    chat_server: LiveServer, chat_peer: ChatPeer
) -> None:
    chat_peer.queue(Reply(status=503))
    async with aiohttp.ClientSession() as http, http.ws_connect(chat_server.ws_url) as ws:
        await ws.send_json({"type": "response.create", "model": "model-a", "input": "hi"})
        failed = (await read_until(ws, "response.failed"))[-1]
    assert failed["response"]["error"]["code"] == "server_error"


async def test_timeout_and_mid_stream_disconnect_are_server_errors(
    chat_peer: ChatPeer, engine_for: StartEngine
) -> None:
    server = await engine_for(router_for("chat", chat_peer.base_url, read_timeout=0.3))
    chat_peer.queue(Reply(text="slow answer", delay=0.8), Reply(text="cut answer", cut_after=2))
    async with aiohttp.ClientSession() as http, http.ws_connect(server.ws_url) as ws:
        for _ in range(2):
            await ws.send_json({"type": "response.create", "model": "model-a", "input": "hi"})
            failed = (await read_until(ws, "response.failed"))[-1]
            assert failed["response"]["error"]["code"] == "server_error"


async def test_client_disconnect_closes_the_upstream_request(
    chat_server: LiveServer, chat_peer: ChatPeer
) -> None:
    chat_peer.queue(Reply(text="word " * 400, delay=0.02))
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(chat_server.ws_url)
        await ws.send_json({"type": "response.create", "model": "model-a", "input": "hi"})
        await read_until(ws, "response.output_text.delta")
        await ws.close()
    await asyncio.wait_for(chat_peer.gone.wait(), 2)
    assert chat_peer.finished == 0


async def test_a_namespaced_function_called_by_a_chat_server_keeps_its_namespace(
    chat_server: LiveServer, chat_peer: ChatPeer
) -> None:
    """TOOL-2: the chat server sees ``lookup`` by its plain name; the call the client gets
    carries ``namespace: docs``; hosted and custom tools are accepted and not sent (TOOL-4); the
    sample's ``mcp`` server is refused (a private address), so its listing fails (MCP-11)."""
    from tests.conformance.samples import ALL_TOOLS

    chat_peer.queue(Reply(calls=[Call("lookup", '{"q":"x"}', "call_ns")]))
    status, body = await post(chat_server, model="model-a", input="hi", tools=ALL_TOOLS)
    assert status == 200, body
    listing, call = body["output"]
    assert listing["type"] == "mcp_list_tools" and listing["tools"] == []
    assert (call["name"], call["namespace"]) == ("lookup", "docs")
    assert [t["function"]["name"] for t in chat_peer.last["tools"]] == ["get_weather", "lookup"]


async def test_an_upstream_route_tokenizes_nothing_and_bills_its_counts(
    chat_server: LiveServer, chat_peer: ChatPeer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """UP-8: the upstream counts the prompt, so pre-inference renders no cl100k ids; its
    prompt is the step's input_tokens and the carried-over share of it is cached; the
    input-token count still tokenizes exactly."""
    import engine.conversation.render as render

    encoded: list[str] = []

    def counting(text: str) -> Any:
        encoded.append(text)
        return real_array(text)

    def counting_list(text: str) -> list[int]:
        encoded.append(text)
        return real_list(text)

    real_array, real_list = render.encode_array, render.encode
    monkeypatch.setattr(render, "encode_array", counting)
    monkeypatch.setattr(render, "encode", counting_list)
    chat_peer.queue(
        Reply(calls=[Call("get_weather", '{"city":"Paris"}', "call_p")]),
        Reply(text="It is sunny."),
    )
    common = {"model": "model-a", "tools": [WEATHER], "instructions": "Be brief.", "store": False}
    async with aiohttp.ClientSession() as http, http.ws_connect(chat_server.ws_url) as ws:
        await ws.send_json({"type": "response.create", "input": "Weather in Paris?", **common})
        first = (await read_until(ws, "response.completed"))[-1]["response"]
        output = [{"type": "function_call_output", "call_id": "call_p", "output": "sunny " * 9}]
        await ws.send_json(
            {
                "type": "response.create",
                "previous_response_id": first["id"],
                "input": output,
                **common,
            }
        )
        second = (await read_until(ws, "response.completed"))[-1]["response"]
    assert encoded == []  # nothing tokenized on the way in
    assert first["usage"]["input_tokens"] == second["usage"]["input_tokens"] == 11
    assert first["usage"]["input_tokens_details"]["cached_tokens"] == 0
    # the header, the question and the call were read before: most of the upstream's 11 tokens
    assert 0 < second["usage"]["input_tokens_details"]["cached_tokens"] < 11
    assert "estimated" not in second["usage"]
    body = {"model": "model-a", "input": "Weather in Paris?"}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{chat_server.base_url}/responses/input_tokens", json=body) as resp,
    ):
        assert resp.status == 200 and (await resp.json())["input_tokens"] > 0
    assert encoded  # the count endpoint renders exactly (TOKENS-1)


async def test_a_failed_response_appends_nothing_to_its_conversation(
    chat_server: LiveServer, chat_peer: ChatPeer
) -> None:
    """CONV-5: a response that ends ``failed`` (the upstream's stream cut mid-answer: over HTTP
    a 500 ``server_error``, over WebSocket ``response.failed`` with the partial output)
    appends nothing to its conversation, neither its input nor its output. It lets the
    conversation go (CONV-7), and the next create's context, as the upstream receives it, is
    the conversation without the failed turns."""
    async with aiohttp.ClientSession() as http:
        convs = f"{chat_server.base_url}/conversations"
        async with http.post(convs, json={"items": [{"role": "user", "content": "earlier"}]}) as r:
            conv = (await r.json())["id"]

        async def texts() -> list[str]:
            async with http.get(f"{convs}/{conv}/items?order=asc") as resp:
                return [item["content"][0]["text"] for item in (await resp.json())["data"]]

        chat_peer.queue(Reply(text="a partial answer, cut short", cut_after=2))
        status, failed = await post(chat_server, model="model-a", input="doomed", conversation=conv)
        assert status == 500 and failed["error"]["code"] == "server_error", failed
        assert await texts() == ["earlier"]
        chat_peer.queue(Reply(text="another partial answer, cut", cut_after=2))
        async with http.ws_connect(chat_server.ws_url) as ws:
            create = {"model": "model-a", "input": "doomed too", "conversation": conv}
            await ws.send_json({"type": "response.create", **create})
            ended = (await read_until(ws, "response.failed"))[-1]["response"]
        assert ended["status"] == "failed" and ended["output"], "failed mid-answer"
        assert await texts() == ["earlier"]
        status, done = await post(chat_server, model="model-a", input="again", conversation=conv)
        assert status == 200 and done["status"] == "completed"
        assert chat_peer.last["messages"] == [
            {"role": "user", "content": "earlier"},
            {"role": "user", "content": "again"},
        ]
        assert await texts() == ["earlier", "again", "Echo: again"]
