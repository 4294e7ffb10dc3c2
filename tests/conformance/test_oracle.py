"""The SDK as oracle: every event type the server can emit, parsed strictly by the ``openai`` SDK.

For each outcome the server can produce (text answer, function call, parallel calls, incomplete,
failed, request error, warmup, named lane, append/inject extension) the raw frames are

* validated with pydantic against the SDK's unions (``ResponsesServerEvent`` for WebSocket,
  ``ResponseStreamEvent`` for SSE, ``BetaResponsesServerEvent`` for inject events);
* replayed through the SDK's own stream accumulator (``ResponseStreamState``), which raises on
  ordering faults (event before ``response.created``, changed response id, duplicate
  ``output_index``, content before its item, unfinished items at completion);
* and every ``Response`` they carry is checked field by field (PROTOCOL.md §5): the fields the SDK
  requires are present, ``temperature``/``top_p``/``top_logprobs`` are never null, ``usage`` is
  null before the terminal and complete (with token details) on it.

The last test proves coverage: every server event type declared in ``protocol.events`` was seen.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, get_args

import aiohttp
import msgspec
import openai
import pydantic
import pytest
from openai import AsyncOpenAI, omit
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.beta import BetaResponsesServerEvent
from openai.types.responses import Response, ResponsesServerEvent, ResponseStreamEvent

from engine.core import EngineConfig
from protocol import events as protocol_events
from tests.conformance.oracle_kit import (
    CLOCK,
    MODEL,
    TERMINAL,
    WEATHER,
    broken_router,
    sse_turn,
    start_append,
    types_of,
    ws_turn,
    ws_until_done,
)
from tests.support.fixtures import sdk_client
from tests.support.mcp import sdk_server
from tests.support.oracle import sdk_parse
from tests.support.server import LiveServer, start_server

LIFECYCLE = TERMINAL | {"response.created", "response.in_progress", "response.queued"}
WS_EVENTS: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ResponsesServerEvent)
SSE_EVENTS: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ResponseStreamEvent)
BETA_EVENTS: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(BetaResponsesServerEvent)
# Our experimental extension (append mode); its embedded Response is still checked.
EXTENSION = {"response.done"}

# Fields of Response the SDK requires, and those the OpenAPI schema requires but allows null.
REQUIRED = {"id", "object", "created_at", "model", "output", "parallel_tool_calls"}
REQUIRED |= {"tool_choice", "tools"}
REQUIRED_NULLABLE = {"error", "incomplete_details", "instructions", "metadata"}
NEVER_NULL = {"temperature", "top_p", "top_logprobs", "status"}

PATCH: dict[str, Any] = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Apply a patch to files.",
    "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"},
}
NAMESPACE: dict[str, Any] = {
    "type": "namespace",
    "name": "docs",
    "description": "Documentation tools.",
    "tools": [
        {
            "type": "function",
            "name": "lookup",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
        }
    ],
}


# ----------------------------------------------------------------------------- the oracle


def check_response(raw: dict[str, Any], event_type: str) -> Response:
    """PROTOCOL §5: a wire Response the strictest client accepts."""
    missing = (REQUIRED | REQUIRED_NULLABLE | NEVER_NULL) - set(raw)
    assert not missing, f"{event_type}: Response lacks {sorted(missing)}"
    for name in NEVER_NULL:
        assert raw[name] is not None, f"{event_type}: response.{name} is null"
    assert raw["object"] == "response"
    assert "stream_id" not in raw  # lane ids live on event envelopes only
    response = Response.model_validate(raw)
    if event_type in TERMINAL:
        expected = event_type.removeprefix("response.")
        assert raw["status"] == expected
        usage = raw["usage"]
        assert usage is not None, f"{event_type}: usage missing on terminal"
        assert {"cached_tokens", "cache_write_tokens"} <= set(usage["input_tokens_details"])
        assert "reasoning_tokens" in usage["output_tokens_details"]
        assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
        assert raw["completed_at"] is not None
        if expected == "failed":
            assert raw["error"] is not None and raw["incomplete_details"] is None
        elif expected == "incomplete":
            assert raw["incomplete_details"] is not None and raw["error"] is None
        else:
            assert raw["error"] is None and raw["incomplete_details"] is None
    elif event_type in LIFECYCLE:
        assert raw["usage"] is None, f"{event_type}: usage must be null before the terminal"
        assert raw["status"] in ("in_progress", "queued")
    return response


def check_events(raws: list[dict[str, Any]], adapter: pydantic.TypeAdapter[Any]) -> list[Any]:
    """Strict parse of each event, Response checks, and the SDK accumulator over the sequence."""
    parsed: list[Any] = []
    for raw in raws:
        kind = raw["type"]
        if kind in EXTENSION:
            check_response(raw["response"], kind)
            parsed.append(raw)
            continue
        adapter_for = BETA_EVENTS if kind.startswith("response.inject") else adapter
        event = adapter_for.validate_python(raw)
        parsed.append(event)
        if kind == "error":
            assert isinstance(raw.get("status", 400), int)
            continue
        assert isinstance(raw["sequence_number"], int)
        if "response" in raw:
            check_response(raw["response"], kind)
    lifecycle = [e for e in parsed if not isinstance(e, dict) and e.type != "error"]
    if lifecycle and lifecycle[0].type == "response.created":
        state: ResponseStreamState[Any] = ResponseStreamState(input_tools=omit, text_format=omit)
        for event in lifecycle:
            if event.type.startswith("response.inject"):
                continue
            state.handle_event(event)  # raises on ordering / identity faults
        # One counter per response, shared by notices (inject) and our extension events.
        numbers = [r["sequence_number"] for r in raws if r["type"] != "error"]
        assert numbers == list(range(len(numbers))), numbers
        assert sum(e.type in TERMINAL for e in lifecycle) <= 1
    return parsed


# ----------------------------------------------------------------------------- backends / servers


@pytest.fixture
async def live() -> AsyncIterator[LiveServer]:
    """The simulator for every model name, plus ``broken-*`` models whose backend raises."""
    server = await start_server(router=broken_router())
    try:
        yield server
    finally:
        await server.runner.cleanup()


@pytest.fixture
async def client(live: LiveServer) -> AsyncIterator[AsyncOpenAI]:
    """The openai SDK against ``live`` (the server with broken models)."""
    async with sdk_client(live) as sdk:
        yield sdk


# ----------------------------------------------------------------------------- WebSocket outcomes


async def test_oracle_ws_text_answer(client: AsyncOpenAI) -> None:
    """CONF-1, EV-2, RESP-1 for a text answer."""
    async with client.responses.connect() as conn:
        raws = await ws_turn(conn, input="Say hi", store=False, instructions="Be nice.")
    events = check_events(raws, WS_EVENTS)
    assert events[-1].type == "response.completed"
    final = events[-1].response
    assert final.instructions == "Be nice." and final.temperature == 1.0 and final.top_p == 1.0
    part_added = next(e for e in events if e.type == "response.content_part.added")
    assert part_added.part.type == "output_text" and part_added.part.text == ""
    assert all(e.logprobs == [] for e in events if e.type == "response.output_text.delta")


async def test_oracle_ws_function_call(client: AsyncOpenAI) -> None:
    """CONF-1, EV-2, ORD-6 for a function call."""
    async with client.responses.connect() as conn:
        raws = await ws_turn(conn, input="Weather in Paris?", tools=[WEATHER], store=False)
    events = check_events(raws, WS_EVENTS)
    final = events[-1].response
    (call,) = final.output
    assert call.type == "function_call" and json.loads(call.arguments) == {
        "city": "Paris",
        "days": 1,
    }
    added = next(e for e in events if e.type == "response.output_item.added")
    assert added.item.arguments == "" and added.item.status == "in_progress"
    assert added.item.call_id == call.call_id and added.item.id == call.id
    assert final.tools[0].name == "get_weather"


async def test_oracle_ws_parallel_calls_then_answer(client: AsyncOpenAI) -> None:
    """CONF-1 for parallel calls and their continuation."""
    async with client.responses.connect() as conn:
        raws = await ws_turn(
            conn,
            input="Call get_weather and get_time for Lima",
            tools=[WEATHER, CLOCK],
            parallel_tool_calls=True,
            store=False,
        )
        events = check_events(raws, WS_EVENTS)
        final = events[-1].response
        assert [c.name for c in final.output] == ["get_weather", "get_time"]
        assert len({c.call_id for c in final.output}) == 2
        outputs = [
            {"type": "function_call_output", "call_id": c.call_id, "output": c.name}
            for c in final.output
        ]
        follow = await ws_turn(
            conn, previous_response_id=final.id, input=outputs, tools=[WEATHER, CLOCK], store=False
        )
    answer = check_events(follow, WS_EVENTS)[-1].response
    assert answer.previous_response_id == final.id
    assert answer.output_text == "Based on the tool results: get_weather; get_time"


async def test_oracle_ws_forced_tool_choice(client: AsyncOpenAI) -> None:
    """SIM-3, RESP-2: a named ``tool_choice`` forces that call and is echoed."""
    async with client.responses.connect() as conn:
        raws = await ws_turn(
            conn,
            input="Anything",
            tools=[WEATHER, CLOCK],
            tool_choice={"type": "function", "name": "get_time"},
            store=False,
        )
    final = check_events(raws, WS_EVENTS)[-1].response
    assert [c.name for c in final.output] == ["get_time"]
    assert final.tool_choice.name == "get_time"


async def test_oracle_ws_custom_and_namespaced_calls(client: AsyncOpenAI) -> None:
    """CONF-1, TOOL-2, TOOL-3: a custom tool call streams ``custom_tool_call_input`` events and
    is answered by ``custom_tool_call_output``; a namespaced call carries ``namespace``."""
    async with client.responses.connect() as conn:
        raws = await ws_turn(
            conn, input="Use apply_patch and lookup", tools=[PATCH, NAMESPACE], store=False
        )
        events = check_events(raws, WS_EVENTS)
        final = events[-1].response
        patch, lookup = final.output
        assert patch.type == "custom_tool_call" and patch.name == "apply_patch"
        assert patch.input and lookup.type == "function_call"
        assert (lookup.name, lookup.namespace) == ("lookup", "docs")
        kinds = types_of(raws)
        assert "response.custom_tool_call_input.delta" in kinds
        done = next(e for e in events if e.type == "response.custom_tool_call_input.done")
        assert done.input == patch.input and done.item_id == patch.id
        outputs = [
            {"type": "custom_tool_call_output", "call_id": patch.call_id, "output": "patched"},
            {"type": "function_call_output", "call_id": lookup.call_id, "output": "found"},
        ]
        follow = await ws_turn(
            conn, previous_response_id=final.id, input=outputs, tools=[PATCH, NAMESPACE]
        )
    answer = check_events(follow, WS_EVENTS)[-1].response
    assert answer.output_text == "Based on the tool results: patched; found"
    assert [t.type for t in answer.tools] == ["custom", "namespace"]


async def test_oracle_ws_incomplete(client: AsyncOpenAI) -> None:
    """CONF-1, ORD-8, RESP-3 for ``response.incomplete``."""
    async with client.responses.connect() as conn:
        raws = await ws_turn(conn, input="A long story please", max_output_tokens=2, store=False)
    events = check_events(raws, WS_EVENTS)
    final = events[-1].response
    assert events[-1].type == "response.incomplete"
    assert final.incomplete_details.reason == "max_output_tokens"
    assert final.output[0].status == "incomplete"


async def test_oracle_ws_incomplete_inside_function_call(client: AsyncOpenAI) -> None:
    """ORD-8: ``max_output_tokens`` reached inside a call keeps the call, ``incomplete``."""
    async with client.responses.connect() as conn:
        raws = await ws_turn(
            conn, input="Weather in Paris?", tools=[WEATHER], max_output_tokens=2, store=False
        )
    events = check_events(raws, WS_EVENTS)
    final = events[-1].response
    assert events[-1].type == "response.incomplete"
    (call,) = final.output
    assert call.type == "function_call" and call.status == "incomplete"
    assert "response.function_call_arguments.done" not in types_of(raws)


@pytest.mark.parametrize("model", ["broken-early", "broken-message", "broken-call"])
async def test_oracle_ws_failed(client: AsyncOpenAI, model: str) -> None:
    """ROLL-8, ORD-8, ERR-3, MODEL-2: a backend failure before or during output."""
    async with client.responses.connect() as conn:
        raws = await ws_turn(conn, model=model, input="Weather?", tools=[WEATHER], store=False)
        events = check_events(raws, WS_EVENTS)
        assert events[-1].type == "response.failed"
        final = events[-1].response
        assert final.error.code == "server_error"
        assert "secret-internal-detail" not in json.dumps(raws)  # internal text stays inside
        if model != "broken-early":
            assert final.output[0].status == "incomplete"  # what was produced is kept
        after = await ws_turn(conn, input="Still here?", store=False)
    assert check_events(after, WS_EVENTS)[-1].type == "response.completed"


async def test_oracle_ws_failed_continuation_response_evicts_parent(
    client: AsyncOpenAI, live: LiveServer
) -> None:
    """CACHE-3: a continuation whose response ends ``failed`` evicts its parent; a failed
    response is never cached."""
    async with client.responses.connect() as conn:
        parent = check_events(await ws_turn(conn, input="Start", store=False), WS_EVENTS)[-1]
        failed = await ws_turn(
            conn,
            model="broken-message",
            previous_response_id=parent.response.id,
            input="x",
            store=False,
        )
        assert check_events(failed, WS_EVENTS)[-1].type == "response.failed"
        failed_id = failed[-1]["response"]["id"]
        retries = [
            await ws_turn(conn, previous_response_id=prev, input="again", store=False)
            for prev in (parent.response.id, failed_id)
        ]
    for retry in retries:
        (error,) = check_events(retry, WS_EVENTS)
        assert error.type == "error" and error.error.code == "previous_response_not_found"
    assert live.engine.counters["cache.evicted"] == 1


async def test_oracle_ws_error_event(client: AsyncOpenAI) -> None:
    """ERR-1, CONF-1: WS error envelopes."""
    async with client.responses.connect() as conn:
        raws = await ws_turn(conn, previous_response_id="resp_missing", input="x", store=False)
        await conn.send_raw("{oops")
        raws.append(json.loads(await conn.recv_bytes()))
    events = check_events(raws, WS_EVENTS)
    for raw, event in zip(raws, events, strict=True):
        assert event.type == "error"
        assert set(raw) <= {"type", "status", "error", "sequence_number", "stream_id"}
        assert {"type", "code", "message", "param"} <= set(raw["error"])


async def test_oracle_ws_warmup_and_lane(client: AsyncOpenAI) -> None:
    """WS-9, WS-7, CONF-1."""
    async with client.responses.connect() as conn:
        warm = await ws_turn(conn, input="Warm", generate=False, store=False, stream_id="lane-1")
        events = check_events(warm, WS_EVENTS)
        assert types_of(warm) == ["response.created", "response.completed"]
        assert all(r["stream_id"] == "lane-1" for r in warm)
        assert events[-1].response.output == []
        follow = await ws_turn(
            conn,
            previous_response_id=events[-1].response.id,
            input=[],
            store=False,
            stream_id="lane-1",
        )
    assert check_events(follow, WS_EVENTS)[-1].response.output_text.endswith("Warm")


async def test_oracle_ws_append_and_inject_extension(client: AsyncOpenAI) -> None:
    """Experimental append mode: one response spans the tool round trip (``response.done`` at the
    suspension, beta ``response.inject`` commits the outputs)."""
    async with client.responses.connect() as conn:
        raws, response_id, pending = await start_append(conn, "Weather in Quito?")
        output = {"type": "function_call_output", "call_id": pending["call_id"], "output": "mild"}
        inject = {"type": "response.inject", "response_id": response_id, "input": [output]}
        await conn.send_raw(json.dumps(inject))
        raws += await ws_until_done(conn)
    kinds = types_of(raws)
    assert kinds.count("response.created") == 1 and kinds[-1] == "response.completed"
    assert "response.inject.created" in kinds
    events = check_events(raws, WS_EVENTS)
    final = events[-1].response
    assert final.id == response_id
    assert final.output[-1].type == "message"
    assert final.output_text == "Based on the tool results: mild"


async def test_oracle_ws_inject_invalid_input_is_error_event(client: AsyncOpenAI) -> None:
    """APPEND-3, APPEND-5, CONF-1: an inject with bad items is a WS ``error`` with the item's path
    (``response.inject.failed`` only allows the two target codes), and the rollout keeps waiting."""
    async with client.responses.connect() as conn:
        raws, response_id, pending = await start_append(conn, "Weather in Quito?")
        bad = [{"type": "function_call_output", "call_id": "call_never", "output": "x"}]
        await conn.send_raw(
            json.dumps({"type": "response.inject", "response_id": response_id, "input": bad})
        )
        reply = json.loads(await conn.recv_bytes())
        good = [{"type": "function_call_output", "call_id": pending["call_id"], "output": "ok"}]
        await conn.send_raw(
            json.dumps({"type": "response.inject", "response_id": response_id, "input": good})
        )
        rest = await ws_until_done(conn)
    (error,) = check_events([reply], WS_EVENTS)
    assert error.type == "error" and error.status == 400
    assert error.error.code == "unknown_call_id" and error.error.param == "input[0].call_id"
    events = check_events(raws + rest, WS_EVENTS)
    assert events[-1].type == "response.completed" and events[-1].response.id == response_id


async def test_oracle_ws_inject_target_errors_are_inject_failed(client: AsyncOpenAI) -> None:
    """PROTOCOL §3.4: an inject aimed at a finished append-mode response, or at an unknown one,
    is answered with ``response.inject.failed`` returning the uncommitted input."""
    async with client.responses.connect() as conn:
        done = await ws_turn(conn, input="No tools here", store=False, rollout_mode="append")
        response_id = done[-1]["response"]["id"]
        late = [{"type": "function_call_output", "call_id": "call_late", "output": "x"}]
        replies = []
        for target in (response_id, "resp_unknown"):
            await conn.send_raw(
                json.dumps({"type": "response.inject", "response_id": target, "input": late})
            )
            replies.append(json.loads(await conn.recv_bytes()))
        after = await ws_turn(conn, input="still fine", store=False)
    finished, unknown = (BETA_EVENTS.validate_python(r) for r in replies)
    assert finished.type == unknown.type == "response.inject.failed"
    assert finished.response_id == response_id
    assert finished.error.code == "response_already_completed"
    assert (unknown.response_id, unknown.error.code) == ("resp_unknown", "response_not_found")
    assert all(r["input"] == late for r in replies)
    assert check_events(after, WS_EVENTS)[-1].type == "response.completed"


# ----------------------------------------------------------------------------- SSE outcomes


async def test_oracle_sse_text_function_call_incomplete(live: LiveServer) -> None:
    """HTTP-3, CONF-1 with the SDK's SSE union."""
    text = await sse_turn(live, input="Say hi over SSE")
    call = await sse_turn(live, input="Weather in Cairo?", tools=[WEATHER])
    cut = await sse_turn(live, input="A long story please", max_output_tokens=1)
    assert check_events(text, SSE_EVENTS)[-1].type == "response.completed"
    assert check_events(call, SSE_EVENTS)[-1].response.output[0].type == "function_call"
    assert check_events(cut, SSE_EVENTS)[-1].type == "response.incomplete"


@pytest.mark.parametrize("model", ["broken-early", "broken-message"])
async def test_oracle_sse_failed(live: LiveServer, client: AsyncOpenAI, model: str) -> None:
    """HTTP-4, ROLL-8: a failure after the stream started is in-band ``response.failed``."""
    raws = await sse_turn(live, model=model, input="Weather?")
    events = check_events(raws, SSE_EVENTS)
    assert types_of(raws)[:2] == ["response.created", "response.in_progress"]
    assert events[-1].type == "response.failed"
    assert "secret-internal-detail" not in json.dumps(raws)
    async with client.responses.stream(model=model, input="Weather?") as stream:
        seen = [e.type async for e in stream]
    assert seen[-1] == "response.failed"


async def test_oracle_http_failed_non_streaming_is_500_and_not_retried(live: LiveServer) -> None:
    """HTTP-2: a failed non-streaming create is a 500 ``server_error``; ``x-should-retry: false``
    keeps the SDK's default retries from running (and billing) the model call again."""
    sdk = AsyncOpenAI(base_url=live.base_url, api_key="x")  # default: 2 retries on 5xx
    with pytest.raises(openai.InternalServerError) as info:
        await sdk.responses.create(model="broken-message", input="Weather?")
    await sdk.close()
    assert info.value.status_code == 500
    assert info.value.type == "server_error"
    assert "secret-internal-detail" not in info.value.message
    assert info.value.response.headers.get("x-should-retry") == "false"
    assert live.engine.router.routes["broken-message"].calls == 1


async def test_oracle_http_json_response_is_sdk_response(live: LiveServer) -> None:
    """HTTP-2, RESP-1 for the JSON body."""
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{live.base_url}/responses", json={"model": MODEL, "input": "hi", "tools": [WEATHER]}
        ) as resp,
    ):
        raw = await resp.json()
    check_response(raw, "response.completed")


# ----------------------------------------------------------------------------- coverage


async def test_oracle_every_server_event_type_is_exercised_and_parses(
    live: LiveServer, client: AsyncOpenAI, sdk_oracle: list[bytes]
) -> None:
    """CONF-1, EV-2: run one of each outcome; every type in ``protocol.events.ServerEvent`` must
    have been emitted, and each emitted frame parses with the SDK (the fixture checks at
    teardown too). Remote MCP (MCP-5, MCP-7) against a real MCP server, allowed on loopback."""
    start = len(sdk_oracle)
    live.engine.mcp_limits = EngineConfig(mcp_allow_hosts="127.0.0.1").mcp_limits
    async with client.responses.connect() as conn, sdk_server() as mcp:
        never = {"type": "mcp", "server_label": "m", "server_url": mcp.url}
        never["require_approval"] = "never"
        refused = {"type": "mcp", "server_label": "r", "server_url": "http://10.0.0.1/mcp"}
        await ws_turn(conn, input="use echo", tools=[never, refused])  # listed, failed; a call
        failing = {**never, "server_label": "f", "allowed_tools": ["fail"]}
        await ws_turn(conn, input="use fail", tools=[failing])  # a call that fails
        await ws_turn(conn, input="Text answer")
        done = await ws_turn(conn, input="Weather in Paris?", tools=[WEATHER])
        waiting = done[-1]["response"]
        await conn.response.steer(previous_response_id=waiting["id"], input="hm")
        await conn.recv_bytes()  # response.steer.accepted
        await conn.recv_bytes()  # response.steer.pending: it waits for the tool output
        output = {"type": "function_call_output", "call_id": waiting["output"][0]["call_id"]}
        await ws_turn(
            conn, previous_response_id=waiting["id"], input=[{**output, "output": "sunny"}],
            tools=[WEATHER],
        )  # fmt: skip
        await conn.response.steer(previous_response_id="resp_unknown", input="hm")
        await conn.recv_bytes()  # response.steer.failed
        await ws_turn(conn, input="Patch the README", tools=[PATCH])
        await ws_turn(conn, input="Long story", max_output_tokens=1)
        await ws_turn(
            conn, input=[{"role": "user", "content": "Hi"}, {"type": "compaction_trigger"}]
        )
        await ws_turn(conn, model="broken-message", input="x")
        await ws_turn(conn, model="thinking", input="x")
        await ws_turn(conn, previous_response_id="resp_missing", input="x")
        _, response_id, pending = await start_append(conn, "Weather in Quito?")
        output = {"type": "function_call_output", "call_id": pending["call_id"], "output": "ok"}
        for target in ("resp_unknown", response_id):
            await conn.send_raw(
                json.dumps({"type": "response.inject", "response_id": target, "input": [output]})
            )
        await ws_until_done(conn)
    emitted = {msgspec.json.decode(raw)["type"] for raw in sdk_oracle[start:]}
    declared = {
        cls.__struct_config__.tag
        for cls in get_args(protocol_events.ServerEvent)
        if cls.__struct_config__.tag is not None
    }
    untested = declared - emitted
    assert not untested, f"server event types never exercised: {sorted(untested)}"
    for raw in sdk_oracle[start:]:
        sdk_parse(raw)
