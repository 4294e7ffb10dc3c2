"""Deterministic reproductions of the bugs the fuzzers found (one test per bug).

A bug that is still open is marked ``@pytest.mark.xfail(reason="BUG: …", strict=True)`` and has
a flag in ``tests/fuzz/known_bugs.py``; when the engine is fixed the test XPASSes (and, strict,
fails), so the mark and the flag go together. The bugs below are fixed; each docstring says what
was wrong.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from protocol.response import Response
from protocol.states import IllegalTransition, ResponseState
from protocol.stream import ResponseStream
from tests.conftest import LiveServer, sdk_parse

TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]


async def _events(ws: aiohttp.ClientWebSocketResponse, *until: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while True:
        msg = await ws.receive(timeout=10)
        assert msg.type is aiohttp.WSMsgType.TEXT, msg
        out.append(json.loads(msg.data))
        if out[-1]["type"] in until:
            return out


# ----------------------------------------------------------------------------- protocol


@pytest.mark.parametrize("method", ["add_message", "add_function_call"])
@pytest.mark.parametrize("state", ["new", "created", "suspended"])
def test_illegal_add_item_leaves_builder_unchanged(method: str, state: str) -> None:
    """STATE-2. ``ResponseStream.add_message``/``add_function_call`` set the open item before
    ``_step()`` checked the transition: an illegal call (NEW, CREATED, SUSPENDED) raised
    ``IllegalTransition`` but left a phantom open item, which a later ``failed()`` put into
    ``response.output`` although it was never announced."""
    stream = ResponseStream(Response(id="resp_x", created_at=1, model="m"))
    if state != "new":
        stream.created()
    if state == "suspended":
        stream.in_progress()
        stream.suspend([])
    args = ("f", "call_1") if method == "add_function_call" else ()
    with pytest.raises(IllegalTransition):
        getattr(stream, method)(*args)
    assert stream.state is ResponseState(state)
    assert not stream.has_open_item  # was: a phantom open item
    if state != "new":
        stream.failed("server_error", "The model failed.", None, 1)
        assert stream.response.output == []  # was: the phantom item showed up as output


# ----------------------------------------------------------------------------- WebSocket


async def _round_trip_parent(
    ws: aiohttp.ClientWebSocketResponse, store: bool = False
) -> tuple[str, str]:
    """A standard response that ended in a tool call: (response id, call id)."""
    await ws.send_json(
        {"type": "response.create", "input": "Weather in Paris?", "tools": TOOLS, "store": store}
    )
    done = (await _events(ws, "response.completed"))[-1]["response"]
    return done["id"], done["output"][0]["call_id"]


@pytest.mark.parametrize(
    "frame",
    [
        "[" * 10_000 + "]" * 10_000,
        '{"type":"response.create","input":' + "[" * 10_000 + "]" * 10_000 + "}",
        '{"type":"response.create","metadata":{"k":' + "[" * 10_000 + "]" * 10_000 + "}}",
    ],
    ids=["frame", "input", "metadata"],
)
async def test_deeply_nested_ws_frame_is_a_request_error(server: LiveServer, frame: str) -> None:
    """ERR-4. msgspec raises ``RecursionError`` on 10,000 nested arrays; the WS driver caught only
    ``ProtocolError``, so the exception escaped ``serve_socket`` and killed the connection."""
    async with aiohttp.ClientSession() as http, http.ws_connect(server.ws_url) as ws:
        await ws.send_str(frame)
        error = (await _events(ws, "error"))[-1]  # was: the socket closed instead
        assert error["status"] == 400
        await ws.send_json({"type": "response.create", "input": "still there?"})
        assert (await _events(ws, "response.completed"))[-1]["type"] == "response.completed"


async def test_deeply_nested_http_body_is_a_400(server: LiveServer) -> None:
    """§12. The same ``RecursionError`` over HTTP became a 500 ``server_error`` although the
    client is at fault."""
    body = '{"input":' + "[" * 10_000 + "]" * 10_000 + "}"
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{server.base_url}/responses", data=body) as response,
    ):
        assert response.status == 400, await response.text()  # was: 500


@pytest.mark.parametrize("garbage", [[1, 2], [{"foo": 1}], [{"type": "bogus"}]])
async def test_inject_failed_for_unknown_target_parses_with_sdk(
    server: LiveServer, garbage: list[Any]
) -> None:
    """CONF-1. ``response.inject.failed`` (unknown or finished target) echoed the raw ``input``;
    anything but a list of valid items made the event fail the SDK's model."""
    async with aiohttp.ClientSession() as http, http.ws_connect(server.ws_url) as ws:
        await ws.send_json({"type": "response.inject", "response_id": "resp_x", "input": garbage})
        event = (await _events(ws, "response.inject.failed", "error"))[-1]
        if event["type"] == "response.inject.failed":
            sdk_parse(event)  # was: the echoed input was not a list of input items


@pytest.mark.parametrize("garbage", [[1, 2], [{"foo": 1}]])
async def test_steer_failed_parses_with_sdk(server: LiveServer, garbage: list[Any]) -> None:
    """CONF-1. ``response.steer.failed`` echoed the raw ``input`` into ``steer.input``, which the
    SDK accepts only as a string or user messages."""
    async with aiohttp.ClientSession() as http, http.ws_connect(server.ws_url) as ws:
        await ws.send_json(
            {"type": "response.steer", "previous_response_id": "resp_x", "input": garbage}
        )
        event = (await _events(ws, "response.steer.failed", "error"))[-1]
        if event["type"] == "response.steer.failed":
            sdk_parse(event)  # was: a validation error


async def test_store_path_error_param_indexes_the_request_input(server: LiveServer) -> None:
    """CODEC-3/VAL-1. The store path validated ``stored context + input`` as one list, so item
    error params were offset by the stored context's length (``input[3]`` for ``input[1]``)."""
    async with aiohttp.ClientSession() as http, http.ws_connect(server.ws_url) as ws:
        parent, call_id = await _round_trip_parent(ws, store=True)
    async with aiohttp.ClientSession() as http, http.ws_connect(server.ws_url) as ws:
        await ws.send_json(  # a new connection: the parent comes from the store (COMPAT-4)
            {
                "type": "response.create",
                "previous_response_id": parent,
                "input": [
                    {"type": "function_call_output", "call_id": call_id, "output": "sunny"},
                    {"type": "function_call_output", "call_id": "call_nope", "output": "x"},
                ],
            }
        )
        error = (await _events(ws, "error"))[-1]
        assert error["error"]["code"] == "unknown_call_id"
        assert error["error"]["param"] == "input[1].call_id"  # was: input[3].call_id


@pytest.mark.parametrize("frame", ["0:", "[1,", "1 2", "true false", '{"a":1}x', '{"type":"nope"'])
async def test_not_json_is_invalid_json(server: LiveServer, frame: str) -> None:
    """CODEC-2. msgspec's typed decoder stops at the first value of the wrong shape, before it
    sees that the rest is not JSON, so such frames and bodies got ``invalid_type``,
    ``missing_required_parameter`` or ``invalid_value`` instead of ``invalid_json``."""
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(server.ws_url) as ws:
            await ws.send_str(frame)
            error = (await _events(ws, "error"))[-1]
            assert error["error"]["code"] == "invalid_json", error
        if not frame.startswith("{"):
            async with http.post(f"{server.base_url}/responses", data=frame) as response:
                body = await response.json()
                assert body["error"]["code"] == "invalid_json", body


async def test_metadata_error_param_is_a_json_path(server: LiveServer) -> None:
    """CODEC-3. A bad metadata value got msgspec's path ``metadata[...]``, not a JSON path."""
    async with aiohttp.ClientSession() as http, http.ws_connect(server.ws_url) as ws:
        await ws.send_json({"type": "response.create", "input": "x", "metadata": {"k": 1}})
        error = (await _events(ws, "error"))[-1]
        assert error["error"]["code"] == "invalid_type"
        assert error["error"]["param"] == "metadata.k", error  # was: 'metadata[...]'
