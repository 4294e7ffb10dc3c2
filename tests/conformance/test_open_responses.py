"""CONF-3: the Open Responses oracle itself. Its tables catch what they must, cover every event
type the server declares, and every outcome the server produces passes them (the shared fixture
in ``tests/conftest.py`` applies the same check to every frame of every test)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, get_args

import aiohttp
import msgspec
from openai import AsyncOpenAI

from engine.models.router import Router
from engine.models.sim.simulator import SimulatedModel
from protocol import events as protocol_events
from tests.conformance.open_responses import (
    CHECKED_EVENT_TYPES,
    EVENTS,
    TABLES,
    check_body,
    check_event,
)
from tests.conformance.oracle_kit import (
    WEATHER,
    BrokenModel,
    sse_turn,
    start_append,
    ws_turn,
    ws_until_done,
)
from tests.support.oracle import BODIES, open_responses_faults
from tests.support.server import LiveServer


def _response() -> dict[str, Any]:
    """A Response that satisfies every table (written by hand from the tables' rules)."""
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 1,
        "completed_at": None,
        "status": "in_progress",
        "incomplete_details": None,
        "model": "m",
        "previous_response_id": None,
        "instructions": None,
        "output": [
            {
                "type": "message",
                "id": "msg_1",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "hi", "annotations": []}],
            }
        ],
        "error": None,
        "tools": [
            {
                "type": "function",
                "name": "f",
                "description": None,
                "parameters": None,
                "strict": None,
            }
        ],
        "tool_choice": "auto",
        "truncation": "disabled",
        "parallel_tool_calls": True,
        "text": {"format": {"type": "text"}},
        "top_p": 1.0,
        "presence_penalty": 0,
        "frequency_penalty": 0.5,
        "top_logprobs": 0,
        "temperature": 1,
        "reasoning": {"effort": None, "summary": None},
        "usage": None,
        "max_output_tokens": None,
        "max_tool_calls": None,
        "store": False,
        "background": False,
        "service_tier": "default",
        "metadata": {},
        "safety_identifier": None,
        "prompt_cache_key": None,
    }


def _created(response: dict[str, Any]) -> dict[str, Any]:
    return {"type": "response.created", "sequence_number": 0, "response": response}


def test_tables_accept_a_conforming_response() -> None:
    """CONF-3: the hand-written conforming Response passes, with all 31 required fields."""
    assert len(TABLES["Response"].required) == 31
    assert check_event(_created(_response())) == []
    assert check_body(_response()) == []


def test_tables_catch_missing_and_mistyped_fields() -> None:
    """CONF-3: each kind of fault is reported with its JSON path."""
    response = _response()
    del response["presence_penalty"]
    response["frequency_penalty"] = None
    response["top_logprobs"] = True  # a bool is not an integer
    response["output"][0]["content"][0].pop("annotations")
    del response["output"][0]["status"]
    response["tools"][0].pop("strict")
    response["truncation"] = "sometimes"
    faults = check_event(_created(response))
    expected = [
        "response.presence_penalty: required field missing",
        "response.frequency_penalty: expected number",
        "response.top_logprobs: expected integer",
        "response.output[0].content[0].annotations: required field missing",
        "response.output[0].status: required field missing",
        "response.tools[0].strict: required field missing",
        "response.truncation: expected 'auto' | 'disabled'",
    ]
    for fault in expected:
        assert any(f.startswith(fault) for f in faults), (fault, faults)
    assert len(faults) == len(expected)


def test_tables_catch_event_envelope_faults() -> None:
    """CONF-3: event fields, the error envelope and unknown types."""
    delta = {
        "type": "response.output_text.delta",
        "sequence_number": "1",
        "item_id": "msg_1",
        "output_index": 0,
        "content_index": 0,
    }
    assert check_event(delta) == [
        "sequence_number: expected integer, got '1'",
        "delta: required field missing",
    ]
    error = {"type": "error", "error": {"type": "x", "code": None, "message": "m", "param": None}}
    assert check_event(error) == [
        "status: required field missing",
        "error.code: expected string, got None",
    ]
    assert check_event({"type": "response.nonsense", "sequence_number": 0}) != []
    compacted = {"object": "response.compaction", "id": "x", "created_at": 1, "output": []}
    assert check_body(compacted) == ["usage: required field missing"]


def test_every_declared_server_event_type_has_a_table() -> None:
    """CONF-3: no event type can escape the oracle; the document's 23 streaming events and its
    two error shapes are all tabled."""
    declared = {
        cls.__struct_config__.tag
        for cls in get_args(protocol_events.ServerEvent)
        if cls.__struct_config__.tag is not None
    }
    assert declared <= CHECKED_EVENT_TYPES, declared - CHECKED_EVENT_TYPES
    assert len(EVENTS) == 23


async def test_every_outcome_passes_the_open_responses_tables(
    server_factory: Callable[..., Any], sdk_oracle: list[bytes]
) -> None:
    """CONF-3 over WebSocket, SSE and JSON: text, function call, incomplete, failed, warmup,
    request error, steer, append/inject. The frames are checked here explicitly (the fixture
    checks them again at teardown), and the JSON bodies were seen by the recorder."""
    routes: dict[str, Any] = {"broken-message": BrokenModel("message")}
    live: LiveServer = await server_factory(router=Router(routes=routes, default=SimulatedModel(0)))
    start, body_start = len(sdk_oracle), len(BODIES)
    sdk = AsyncOpenAI(base_url=live.base_url, api_key="x", max_retries=0)
    async with sdk.responses.connect() as conn:
        await ws_turn(conn, input="Text answer", instructions="Be brief.")
        done = await ws_turn(conn, input="Weather in Paris?", tools=[WEATHER])
        await ws_turn(conn, input="Long story", max_output_tokens=1)
        await ws_turn(conn, model="broken-message", input="x")
        await ws_turn(conn, input="warm", generate=False, stream_id="lane-1")
        await ws_turn(conn, previous_response_id="resp_missing", input="x")
        await conn.response.steer(previous_response_id=done[-1]["response"]["id"], input="hm")
        await conn.recv_bytes()
        _, response_id, pending = await start_append(conn, "Weather in Quito?")
        output = {"type": "function_call_output", "call_id": pending["call_id"], "output": "ok"}
        await conn.send_raw(
            json.dumps({"type": "response.inject", "response_id": response_id, "input": [output]})
        )
        await ws_until_done(conn)
    await sse_turn(live, input="Over SSE", tools=[WEATHER])
    async with aiohttp.ClientSession() as http:
        body = {"model": "m", "input": "JSON please", "presence_penalty": 0.25}
        async with http.post(f"{live.base_url}/responses", json=body) as resp:
            echoed = await resp.json()
    await sdk.close()
    assert echoed["presence_penalty"] == 0.25 and echoed["frequency_penalty"] == 0
    frames = sdk_oracle[start:]
    seen = {msgspec.json.decode(raw)["type"] for raw in frames}
    assert {"response.failed", "response.incomplete", "error", "response.done"} <= seen
    assert len(BODIES) > body_start
    assert open_responses_faults(frames, BODIES[body_start:]) == []
