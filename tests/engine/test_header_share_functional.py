"""A continuation's echoed instructions and tools are its own, whether the previous turn's
objects are reused (unchanged header, CODEC-6) or not (PIPE-4), on a real server."""

from __future__ import annotations

from typing import Any

import aiohttp

from tests.support.server import LiveServer
from tests.support.tools import READ_FILE
from tests.support.ws import turn


async def _created_and_completed(
    ws: aiohttp.ClientWebSocketResponse, event: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    events = await turn(ws, event)
    assert events[-1]["type"] == "response.completed", events[-1]
    (created,) = (e["response"] for e in events if e["type"] == "response.created")
    return created, events[-1]["response"]


async def _header_renders(server: LiveServer) -> dict[str, int]:
    """Per response: how often pre-inference rendered its instructions/tools header (PIPE-4),
    from the ledger records (POST-1: one per response, its own stage runs)."""
    await server.engine.post.stop()  # every record accounted
    return {
        rid: record.stage_runs.get("header.render", 0)
        for record in server.engine.post.recent
        for rid in record.response_ids
    }


async def test_changed_then_unchanged_header_is_echoed_as_sent(server: LiveServer) -> None:
    first = {"type": "response.create", "model": "sim", "input": "read_file a.py",
             "tools": [READ_FILE], "instructions": "Be brief.", "store": False}  # fmt: skip
    async with aiohttp.ClientSession() as session, session.ws_connect(server.ws_url) as ws:
        _, done = await _created_and_completed(ws, first)
        expected = {done["id"]: 1}
        # Unchanged (the previous turn's header and objects reused: not rendered), then dropped
        # (a new header, rendered again).
        for tools, instructions, renders in (([READ_FILE], "Be brief.", 0), ([], None, 1)):
            call = done["output"][-1]
            assert call["type"] == "function_call", done["output"]
            output = {"type": "function_call_output", "call_id": call["call_id"], "output": "1"}
            follow = {**first, "input": [output], "previous_response_id": done["id"],
                      "tools": tools, "instructions": instructions,
                      "tool_choice": "required" if tools else "auto"}  # fmt: skip
            created, done = await _created_and_completed(ws, follow)
            expected[done["id"]] = renders
            assert [t["name"] for t in done["tools"]] == [t["name"] for t in tools]
            assert done["instructions"] == instructions
            assert (created["tools"], created["instructions"]) == ([], None)  # RESP-5
    assert await _header_renders(server) == expected
