"""Our server in front of an HTTP-only Responses peer (UP-RESP-1..UP-RESP-5): items and deltas
are relayed, the full context goes up each step unless the route continues by id."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from tests.support.http import post
from tests.support.server import LiveServer
from tests.support.tools import WEATHER
from tests.support.ws import read_until
from tests.upstream.conftest import StartEngine, router_for
from tests.upstream.peer import SECRET, Call, Reply, ResponsesPeer

FCO = {"type": "function_call_output", "call_id": "call_r", "output": "sunny"}


async def tool_round(server: LiveServer, peer: ResponsesPeer, **extra: Any) -> list[dict[str, Any]]:
    """Weather question -> call -> output -> answer, over WS with the compat fast path."""
    peer.queue(
        Reply(text="Checking.", calls=[Call("get_weather", '{"city":"Paris"}', "call_r")]),
        Reply(text="It is sunny."),
    )
    common = {"model": "model-a", "tools": [WEATHER], "instructions": "Be brief.", "store": False}
    async with aiohttp.ClientSession() as http, http.ws_connect(server.ws_url) as ws:
        await ws.send_json({"type": "response.create", "input": "Weather?", **common, **extra})
        first = (await read_until(ws, "response.completed"))[-1]
        assert [i["type"] for i in first["response"]["output"]] == ["message", "function_call"]
        await ws.send_json(
            {
                "type": "response.create",
                "previous_response_id": first["response"]["id"],
                "input": [FCO],
                **common,
            }
        )
        second = (await read_until(ws, "response.completed"))[-1]
    assert second["response"]["output"][0]["content"][0]["text"] == "It is sunny."
    return [r.body for r in peer.requests]


async def test_text_relay_and_usage(
    responses_server: LiveServer, responses_peer: ResponsesPeer
) -> None:
    status, body = await post(responses_server, model="model-a", input="hi", store=False)
    assert status == 200 and body["output"][0]["content"][0]["text"] == "Hello from upstream"
    assert body["usage"]["output_tokens"] == 7
    sent = responses_peer.last
    assert sent["model"] == "up-model" and sent["stream"] is True and sent["store"] is False
    assert sent["input"] == [{"type": "message", "role": "user", "content": "hi"}]


async def test_a_responses_route_tokenizes_nothing_on_the_way_in(
    responses_server: LiveServer, responses_peer: ResponsesPeer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """UP-8: the upstream counts and reports the prompt; pre-inference renders no cl100k ids."""
    import engine.conversation.render as render

    def refuse(text: str) -> Any:
        raise AssertionError(f"tokenized on an upstream route: {text[:40]!r}")

    monkeypatch.setattr(render, "encode_array", refuse)
    monkeypatch.setattr(render, "encode", refuse)
    await tool_round(responses_server, responses_peer)


async def test_full_context_each_step_without_our_ids(
    responses_server: LiveServer, responses_peer: ResponsesPeer
) -> None:
    first, second = await tool_round(responses_server, responses_peer, max_output_tokens=99)
    assert first["instructions"] == "Be brief." and first["max_output_tokens"] == 99
    assert first["tools"] == [WEATHER]
    assert "previous_response_id" not in second
    assert second["input"] == [
        {"type": "message", "role": "user", "content": "Weather?"},
        {
            "type": "message",
            "role": "assistant",
            "content": [
                {"type": "output_text", "text": "Checking.", "annotations": [], "logprobs": []}
            ],
        },
        {
            "type": "function_call",
            "call_id": "call_r",
            "name": "get_weather",
            "arguments": '{"city":"Paris"}',
        },
        FCO,
    ]


async def test_continue_by_id_sends_only_new_items(
    responses_peer: ResponsesPeer, engine_for: StartEngine
) -> None:
    server = await engine_for(router_for("responses", responses_peer.base_url, continue_by_id=True))
    first, second = await tool_round(server, responses_peer)
    assert first["store"] is True and "previous_response_id" not in first
    assert second["previous_response_id"] == "resp_up_1"
    assert second["input"] == [FCO]


async def test_rejected_continuation_falls_back_to_full_context(
    responses_peer: ResponsesPeer, engine_for: StartEngine
) -> None:
    server = await engine_for(router_for("responses", responses_peer.base_url, continue_by_id=True))
    responses_peer.queue(
        Reply(calls=[Call("get_weather", '{"city":"Paris"}', "call_r")]),
        Reply(status=400, error_body={"error": {"message": "Previous response not found."}}),
        Reply(text="It is sunny."),
    )
    async with aiohttp.ClientSession() as http, http.ws_connect(server.ws_url) as ws:
        common = {"model": "model-a", "tools": [WEATHER], "store": False}
        await ws.send_json({"type": "response.create", "input": "Weather?", **common})
        first = (await read_until(ws, "response.completed"))[-1]
        await ws.send_json(
            {
                "type": "response.create",
                "previous_response_id": first["response"]["id"],
                "input": [FCO],
                **common,
            }
        )
        await read_until(ws, "response.completed")
    retry = responses_peer.requests[2].body
    assert "previous_response_id" not in retry and len(retry["input"]) == 3


async def test_incomplete_and_failed_upstream_responses(
    responses_server: LiveServer, responses_peer: ResponsesPeer
) -> None:
    responses_peer.queue(Reply(text="Once upon", finish="length"), Reply(text="x", finish="failed"))
    _, body = await post(responses_server, model="model-a", input="story", max_output_tokens=2)
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    async with aiohttp.ClientSession() as http, http.ws_connect(responses_server.ws_url) as ws:
        await ws.send_json({"type": "response.create", "model": "model-a", "input": "hi"})
        events = await read_until(ws, "response.failed")
        failed = events[-1]
    assert failed["response"]["error"]["code"] == "server_error"
    assert SECRET not in json.dumps(events)


async def test_reasoning_items_are_dropped_and_counted(
    responses_server: LiveServer, responses_peer: ResponsesPeer
) -> None:
    reasoning = {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [{"type": "summary_text", "text": "t"}],
    }
    user = {"type": "message", "role": "user", "content": "hi"}
    await post(responses_server, model="model-a", input=[reasoning, user], store=False)
    assert responses_peer.last["input"] == [user]
    stats_url = f"http://127.0.0.1:{responses_server.port}/debug/stats"
    async with aiohttp.ClientSession() as http, http.get(stats_url) as r:
        stats = await r.json()
    assert stats["backends"]["gpt-up"]["dropped.reasoning"] == 1


async def test_hosted_tools_opaque_items_and_forced_hosted_choice_are_forwarded(
    responses_server: LiveServer, responses_peer: ResponsesPeer
) -> None:
    """TOOL-1, TOOL-4, TOOL-5, ITEM-7: a Responses upstream runs hosted tools, so every tool is
    forwarded exactly as sent (except ``mcp``, which the engine runs itself and never forwards,
    MCP-6), a forced hosted ``tool_choice`` is accepted and forwarded, and opaque input items go
    up unchanged."""
    from tests.conformance.samples import ALL_TOOLS, ECHOED_TOOLS

    shell_call = {"type": "shell_call", "call_id": "sh_1", "action": {"commands": ["ls"]}}
    shell_out = {"type": "shell_call_output", "call_id": "sh_1", "output": [{"stdout": "a"}]}
    user = {"type": "message", "role": "user", "content": "Search for it"}
    choice = {"type": "web_search_preview"}
    responses_peer.queue(Reply(text="Searched."))
    status, body = await post(
        responses_server,
        model="model-a",
        input=[shell_call, shell_out, user],
        tools=ALL_TOOLS,
        tool_choice=choice,
        store=False,
    )
    assert status == 200, body
    assert body["tools"] == ECHOED_TOOLS and body["tool_choice"] == choice
    sent = responses_peer.last
    forwarded = [tool for tool in ALL_TOOLS if tool["type"] != "mcp"]
    assert sent["tools"] == forwarded and sent["tool_choice"] == choice
    assert sent["input"] == [shell_call, shell_out, user]


async def test_namespaced_and_custom_calls_from_the_upstream_are_relayed(
    responses_server: LiveServer, responses_peer: ResponsesPeer
) -> None:
    """TOOL-2, TOOL-3: the upstream's ``namespace`` on a function call and its custom tool calls
    (input streamed as ``custom_tool_call_input`` deltas) reach the client as such."""
    from tests.conformance.samples import CUSTOM, NAMESPACE

    responses_peer.queue(
        Reply(
            calls=[
                Call("lookup", '{"q":"x"}', "call_ns", namespace="docs"),
                Call("apply_patch", "*** Begin Patch", "call_cu", custom=True),
            ]
        )
    )
    status, body = await post(
        responses_server, model="model-a", input="hi", tools=[NAMESPACE, CUSTOM], store=False
    )
    assert status == 200, body
    lookup, patch = body["output"]
    assert (lookup["type"], lookup["name"], lookup["namespace"]) == (
        "function_call",
        "lookup",
        "docs",
    )
    assert (patch["type"], patch["input"]) == ("custom_tool_call", "*** Begin Patch")
