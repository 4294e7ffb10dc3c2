"""A connection's repeated tools and instructions (CACHE-5): reused, never trusted blindly.

Codex resends the same ``tools`` and ``instructions`` on every ``response.create``. The
connection checks them once and reuses the checked view while the bytes stay the same; any
change is checked in full and reported exactly as on a fresh connection.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from protocol.codec import Repeats, decode_client_event
from protocol.events import ResponseCreate
from tests.conformance.samples import CUSTOM, FUNCTION
from tests.support.server import LiveServer

INSTRUCTIONS = "You are a careful coding agent. " * 40
BAD_TOOL: dict[str, Any] = {"type": "function", "parameters": {"type": "object"}}  # no name


async def ws_turn(ws: aiohttp.ClientWebSocketResponse, frame: str) -> list[str]:
    """Send one create (raw text); the raw frames up to its terminal event or error."""
    await ws.send_str(frame)
    frames: list[str] = []
    while True:
        frames.append(await ws.receive_str(timeout=10))
        kind = json.loads(frames[-1])["type"]
        if kind in ("response.completed", "response.failed", "response.incomplete", "error"):
            return frames


def create(tools: list[dict[str, Any]], prev: str | None, text: str = "hi") -> str:
    frame: dict[str, Any] = {
        "type": "response.create",
        "model": "sim",
        "store": False,
        "instructions": INSTRUCTIONS,
        "tools": tools,
        "tool_choice": "none",  # text answers: each turn can follow the last
        "input": text,
    }
    if prev is not None:
        frame["previous_response_id"] = prev
    return json.dumps(frame)


def completed(frames: list[str]) -> dict[str, Any]:
    terminal: dict[str, Any] = json.loads(frames[-1])
    assert terminal["type"] == "response.completed", frames[-1]
    response: dict[str, Any] = terminal["response"]
    return response


async def test_changed_tools_after_a_cached_turn_are_checked_in_full(server: LiveServer) -> None:
    """CACHE-5: after two turns with the same tools, a create whose tools changed is not served
    from the connection's memory: a bad tool gets the very error (status, code, message, param)
    a fresh connection gets, the socket stays usable, and a changed valid tool is echoed as
    newly sent."""
    tools = [FUNCTION, CUSTOM]
    changed = [FUNCTION, {**CUSTOM, "description": "Patch files, carefully."}]
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(server.ws_url) as ws:
            fresh = json.loads((await ws_turn(ws, create([FUNCTION, BAD_TOOL], None)))[-1])
        assert fresh["type"] == "error" and fresh["error"]["param"].startswith("tools[1]")
        async with http.ws_connect(server.ws_url) as ws:
            first = completed(await ws_turn(ws, create(tools, None)))
            second = completed(await ws_turn(ws, create(tools, first["id"], "again")))
            assert second["tools"] == first["tools"] and second["instructions"] == INSTRUCTIONS
            (error,) = await ws_turn(ws, create([FUNCTION, BAD_TOOL], second["id"]))
            assert json.loads(error) == fresh
            third = completed(await ws_turn(ws, create(changed, second["id"], "more")))
            assert third["tools"][1]["description"] == "Patch files, carefully."
            fourth = completed(await ws_turn(ws, create(tools, third["id"], "back")))
            assert fourth["tools"] == first["tools"]


def test_equal_tools_and_instructions_are_decoded_once() -> None:
    """CACHE-5: the same tools' bytes reuse the checked toolset (and its echo), equal
    instructions the same string object; one changed byte builds a new toolset."""
    repeats = Repeats()
    first = decode_client_event(create([FUNCTION, CUSTOM], None), repeats)
    second = decode_client_event(create([FUNCTION, CUSTOM], "resp_1"), repeats)
    assert isinstance(first, ResponseCreate) and isinstance(second, ResponseCreate)
    assert second.toolset is first.toolset
    assert second.instructions is first.instructions
    changed = decode_client_event(create([FUNCTION, {**CUSTOM, "name": "apply"}], None), repeats)
    assert isinstance(changed, ResponseCreate)
    assert changed.toolset is not first.toolset
    assert changed.toolset.callables[1].name == "apply"


async def test_http_creates_reuse_the_same_tools_and_check_changed_ones_in_full(
    server: LiveServer,
) -> None:
    """CACHE-7: over HTTP, creates that repeat their tools' bytes are answered as before (the
    same echo) from the process's memory of them; tools that differ from every remembered
    create's, sent after them, get the very error (status and body) a fresh server gives, and
    a changed valid tool is echoed as newly sent."""
    tools = [FUNCTION, CUSTOM]
    changed = [FUNCTION, {**CUSTOM, "description": "Patch files, carefully."}]
    url = f"{server.base_url}/responses"

    async def post(http: aiohttp.ClientSession, tools: list[dict[str, Any]]) -> Any:
        body = json.loads(create(tools, None))
        del body["type"]
        async with http.post(url, json=body) as resp:
            return resp.status, await resp.json()

    async with aiohttp.ClientSession() as http:
        fresh = await post(http, [FUNCTION, BAD_TOOL])
        assert fresh[0] == 400 and fresh[1]["error"]["param"].startswith("tools[1]")
    async with aiohttp.ClientSession() as http:
        first = await post(http, tools)
        remembered = len(server.engine.tools)
        second = await post(http, tools)
        assert len(server.engine.tools) == remembered >= 1  # reused, not remembered twice
        assert first[0] == second[0] == 200 and second[1]["tools"] == first[1]["tools"]
        assert await post(http, [FUNCTION, BAD_TOOL]) == fresh
        status, third = await post(http, changed)
        assert status == 200 and third["tools"][1]["description"] == "Patch files, carefully."
        assert (await post(http, tools))[1]["tools"] == first[1]["tools"]
