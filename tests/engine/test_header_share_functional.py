"""A continuation's echoed instructions and tools are its own, whether the previous turn's
objects are reused (unchanged header, CODEC-6) or not (PIPE-4), on a real server."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from tests.support.server import LiveServer

TOOL: Any = {
    "type": "function",
    "name": "read_file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
}


async def _created_and_completed(
    ws: aiohttp.ClientWebSocketResponse, event: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    await ws.send_str(json.dumps(event))
    created: dict[str, Any] = {}
    while True:
        data = json.loads(await ws.receive_str())
        assert data["type"] != "error", data
        if data["type"] == "response.created":
            created = data["response"]
        if data["type"] == "response.completed":
            return created, data["response"]


async def test_changed_then_unchanged_header_is_echoed_as_sent(server: LiveServer) -> None:
    first = {"type": "response.create", "model": "sim", "input": "read_file a.py",
             "tools": [TOOL], "instructions": "Be brief.", "store": False}  # fmt: skip
    async with aiohttp.ClientSession() as session, session.ws_connect(server.ws_url) as ws:
        _, done = await _created_and_completed(ws, first)
        # Unchanged (objects reused), then dropped: an empty header renders 0 tokens too.
        for tools, instructions in (([TOOL], "Be brief."), ([], None)):
            call = done["output"][-1]
            output = {"type": "function_call_output", "call_id": call["call_id"], "output": "1"}
            follow = {**first, "input": [output], "previous_response_id": done["id"],
                      "tools": tools, "instructions": instructions,
                      "tool_choice": "required" if tools else "auto"}  # fmt: skip
            created, done = await _created_and_completed(ws, follow)
            for response in (created, done):
                assert [t["name"] for t in response["tools"]] == [t["name"] for t in tools]
                assert response["instructions"] == instructions
            if not done["output"] or done["output"][-1]["type"] != "function_call":
                break
