"""The Codex flows a balancer and Codex's own client depend on, with the real server and real
clients (aiohttp's WebSocket client, the openai SDK): the ``x-codex-turn-state`` token
(TURN-1..TURN-4), ``response.processed`` (WS-15), remote compaction with a
``compaction_trigger`` (COMPACT-7) and a warmup in the middle of a connection (WS-9). The Codex
CLI itself drives these in ``test_codex_cli.py``; every frame is also checked by the SDK and
Open Responses oracles (``tests/conftest.py``)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI, BadRequestError

from engine.conversation.compaction import unseal
from engine.server.transport.server_config import ServerConfig
from engine.server.transport.turn_state import HEADER, TOKEN, new_token
from tests.support.server import LiveServer
from tests.support.tools import WEATHER

TERMINAL = {"response.completed", "response.failed", "response.incomplete"}
NODE = "node-a"
TRIGGER = {"type": "compaction_trigger"}
LONG = " ".join(f"word{n}" for n in range(300))  # the bulk a compaction replaces


def conversation() -> list[dict[str, Any]]:
    """A user question, a tool round and the model's answer: what a compaction replaces."""
    return [
        {"role": "user", "content": "Weather in Lima?"},
        {"type": "function_call", "call_id": "call_a", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_a", "output": f"sunny, 24 C {LONG}"},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": f"It is sunny in Lima. {LONG}"}],
        },
    ]


def untyped(value: Any) -> Any:
    """Raw JSON items for the SDK, whose TypedDicts cannot tell these item types apart."""
    return value


async def node(server_factory: Callable[..., Any]) -> LiveServer:
    live: LiveServer = await server_factory(server=ServerConfig(node_id=NODE))
    return live


async def turn(ws: aiohttp.ClientWebSocketResponse, **create: Any) -> list[dict[str, Any]]:
    """Send one ``response.create`` and read every frame up to its terminal event."""
    await ws.send_str(json.dumps({"type": "response.create", "model": "sim", **create}))
    frames: list[dict[str, Any]] = []
    while not frames or frames[-1]["type"] not in TERMINAL | {"error"}:
        frames.append(json.loads(await ws.receive_str(timeout=10)))
    return frames


# --------------------------------------------------------------------------- turn state


async def test_turn_state_is_issued_in_the_handshake_and_echoed(
    server_factory: Callable[..., Any],
) -> None:
    """TURN-1, TURN-2: the 101 carries a fresh token naming this node; a reconnect presenting
    it (Codex, within one turn) gets the same token back; a token of another node is echoed
    and counted; a malformed one is replaced. None of them changes what the socket does."""
    live = await node(server_factory)
    counters = live.engine.counters
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(live.ws_url) as ws:
            issued = ws._response.headers[HEADER]
            assert TOKEN.fullmatch(issued) and issued.split(".")[1] == NODE
            assert (await turn(ws, input="hi"))[-1]["type"] == "response.completed"
        async with http.ws_connect(live.ws_url, headers={HEADER: issued}) as ws:
            assert ws._response.headers[HEADER] == issued
        foreign = new_token("node-b")
        async with http.ws_connect(live.ws_url, headers={HEADER: foreign}) as ws:
            assert ws._response.headers[HEADER] == foreign
            assert (await turn(ws, input="hi"))[-1]["type"] == "response.completed"
        async with http.ws_connect(live.ws_url, headers={HEADER: "rts1.bad token"}) as ws:
            fresh = ws._response.headers[HEADER]
            assert TOKEN.fullmatch(fresh) and fresh not in (issued, foreign)
    assert counters["turn_state.issued"] == 2
    assert counters["turn_state.echoed"] == counters["turn_state.foreign"] == 1


async def test_turn_state_on_http_answers(server_factory: Callable[..., Any]) -> None:
    """TURN-2: over HTTP the token is a header of the create's answer, JSON or SSE, and a
    request presenting one gets it back; refusals (4xx) carry none. Routes other than
    ``/v1/responses`` carry none either."""
    live = await node(server_factory)
    sdk = AsyncOpenAI(base_url=live.base_url, api_key="x", max_retries=0)
    try:
        raw = await sdk.responses.with_raw_response.create(model="sim", input="hi")
        issued = raw.headers[HEADER]
        assert TOKEN.fullmatch(issued) and issued.split(".")[1] == NODE
        again = await sdk.responses.with_raw_response.create(
            model="sim", input="hi", stream=True, extra_headers={HEADER: issued}
        )
        assert again.headers[HEADER] == issued
        async for _ in again.parse():
            pass
        with pytest.raises(BadRequestError) as refused:
            await sdk.responses.create(model="sim", input=untyped([{"type": "nonsense"}]))
        assert HEADER not in refused.value.response.headers
        models = await sdk.models.with_raw_response.list()
        assert HEADER not in models.headers
    finally:
        await sdk.close()
    assert live.engine.counters["turn_state.echoed"] == 1


def test_node_ids_are_checked() -> None:
    """TURN-1: a node id is what a balancer can match in one header field."""
    from engine.server.transport.turn_state import check_node_id, default_node_id, node_of

    assert re.fullmatch(r"[A-Za-z0-9_-]{1,64}", default_node_id())
    assert node_of(new_token("n_1-x")) == "n_1-x"
    assert node_of("rts1.n1.short") is None and node_of("rts2.n1." + "0" * 32) is None
    with pytest.raises(ValueError):
        check_node_id("has.dot")


# --------------------------------------------------------------------------- response.processed


async def test_response_processed_is_accepted_and_never_answered(server: LiveServer) -> None:
    """WS-15: `response.processed` (Codex's acknowledgement after it consumed a response) is
    counted and draws no frame at all, for a known or an unknown id: the next frame on the
    socket belongs to the next create. A malformed one is an ordinary request error."""
    async with aiohttp.ClientSession() as http, http.ws_connect(server.ws_url) as ws:
        first = await turn(ws, input="hi")
        done = first[-1]["response"]["id"]
        for response_id in (done, "resp_unknown"):
            await ws.send_str(
                json.dumps({"type": "response.processed", "response_id": response_id})
            )
        frames = await turn(ws, input="again", previous_response_id=done)
        assert (
            frames[0]["type"] == "response.created" and frames[-1]["type"] == "response.completed"
        )
        await ws.send_str(json.dumps({"type": "response.processed"}))
        error = json.loads(await ws.receive_str(timeout=10))
        assert error["type"] == "error" and error["error"]["param"] == "response_id"
    assert server.engine.counters["ws.response_processed"] == 2


# --------------------------------------------------------------------------- compaction_trigger


def compaction_frames(frames: list[dict[str, Any]]) -> list[str]:
    return [f["type"] for f in frames]


async def test_compaction_trigger_over_websocket_chain(server: LiveServer) -> None:
    """COMPACT-7: a create whose input ends with `compaction_trigger` is answered with exactly
    one output item, the compaction (added, `response.compaction.compacting`, done), standing
    for everything but the client's messages, the trailing tool round included. The chain
    continues from the compacted context."""
    async with aiohttp.ClientSession() as http, http.ws_connect(server.ws_url) as ws:
        first = await turn(ws, input=conversation(), tools=[WEATHER])
        before = first[-1]["response"]["usage"]["input_tokens"]
        frames = await turn(
            ws, input=[TRIGGER], previous_response_id=first[-1]["response"]["id"], tools=[WEATHER]
        )
        assert compaction_frames(frames) == [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.compaction.compacting",
            "response.output_item.done",
            "response.completed",
        ]
        response = frames[-1]["response"]
        (item,) = response["output"]
        assert item["type"] == "compaction" and frames[3]["item_id"] == item["id"]
        assert frames[3]["output_index"] == 0
        summary = unseal(item["encrypted_content"]) or ""
        assert summary.startswith("Summary of 4 earlier items:")  # the round and the answer
        assert "sunny, 24 C" in summary and "Weather in Lima" not in summary
        assert response["usage"]["output_tokens"] > 0
        after = await turn(
            ws, input="And Quito?", previous_response_id=response["id"], tools=[WEATHER]
        )
        assert after[-1]["type"] == "response.completed"
        assert after[-1]["response"]["usage"]["input_tokens"] < before
    assert server.engine.counters["compaction.trigger"] == 1


async def test_compaction_trigger_over_http_with_the_sdk(server: LiveServer) -> None:
    """COMPACT-7 over HTTP/SSE with the openai SDK: its typed stream carries the
    `ResponseCompactionCompactingEvent`; `/input_tokens` does not count a trailing trigger; a
    trigger anywhere but last is a 400 naming it."""
    sdk = AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    try:
        stream = await sdk.responses.create(
            model="sim",
            input=untyped([*conversation(), TRIGGER]),
            tools=untyped([WEATHER]),
            stream=True,
        )
        events = [event async for event in stream]
        kinds = [type(e).__name__ for e in events]
        assert "ResponseCompactionCompactingEvent" in kinds
        last: Any = events[-1]
        assert [o.type for o in last.response.output] == ["compaction"]
        with pytest.raises(BadRequestError) as misplaced:
            await sdk.responses.create(model="sim", input=untyped([TRIGGER, *conversation()]))
        counted = [
            await sdk.responses.input_tokens.count(model="sim", input=untyped(items))
            for items in (conversation(), [*conversation(), TRIGGER])
        ]
        assert counted[0].input_tokens == counted[1].input_tokens  # the trigger is not context
        body = misplaced.value.body
        assert isinstance(body, dict) and body["param"] == "input[0]"
        assert body["code"] == "invalid_value"
    finally:
        await sdk.close()


# --------------------------------------------------------------------------- generate: false


async def test_warmup_in_the_middle_of_a_connection(server: LiveServer) -> None:
    """WS-9: `generate: false` is honoured at any point of a connection, not only as the first
    create: after a finished response and after a tool call (its outputs warmed with the
    round), chained by `previous_response_id`; each warmup completes empty straight from
    `response.created`, and the continuation counts the warmed tokens as cached."""
    async with aiohttp.ClientSession() as http, http.ws_connect(server.ws_url) as ws:
        first = await turn(ws, input="hi")
        warm = await turn(
            ws,
            input="Weather in Lima?",
            generate=False,
            previous_response_id=first[-1]["response"]["id"],
            tools=[WEATHER],
        )
        assert compaction_frames(warm) == ["response.created", "response.completed"]
        warmed = warm[-1]["response"]
        assert warmed["output"] == [] and warmed["usage"]["output_tokens"] == 0
        called = await turn(ws, input=[], previous_response_id=warmed["id"], tools=[WEATHER])
        response = called[-1]["response"]
        assert (
            response["usage"]["input_tokens_details"]["cached_tokens"]
            >= warmed["usage"]["input_tokens"]
        )
        (call,) = [o for o in response["output"] if o["type"] == "function_call"]
        output = {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}
        warm_again = await turn(
            ws, input=[output], generate=False, previous_response_id=response["id"], tools=[WEATHER]
        )
        assert compaction_frames(warm_again) == ["response.created", "response.completed"]
        final = await turn(
            ws, input=[], previous_response_id=warm_again[-1]["response"]["id"], tools=[WEATHER]
        )
        assert final[-1]["type"] == "response.completed"
        assert any(o["type"] == "message" for o in final[-1]["response"]["output"])
    assert server.engine.counters["ws.connections"] == 1
