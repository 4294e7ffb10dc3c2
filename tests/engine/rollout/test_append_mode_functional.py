"""Experimental append mode on a real server, driven with raw WebSocket frames (APPEND-1..6).

Also proves the rollout's economics: pre-inference over the history ran once, every resume
processed only the new items, post-inference ran once for the whole rollout (ROLL-2, POST-1).
"""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from engine.conversation.render import render_item
from engine.models.sim.scenarios import CODING_AGENT_STEPS
from protocol.codec import parse_input
from tests.support.server import LiveServer
from tests.support.tools import WEATHER_LOOSE
from tests.support.wait import wait_for
from tests.support.ws import HeldTerminal, HeldWrite, next_event, read_until

CODING_TOOLS = [
    {"type": "function", "name": name, "parameters": {"type": "object", "properties": {}}}
    for name in ("list_dir", "read_file", "search", "edit_file", "run_tests")
]


def _output_for(call_id: str, size: int = 3000) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": "x = 1\n" * (size // 6)}


async def test_append_rollout_is_one_response_with_incremental_resumes(server: LiveServer) -> None:
    async with aiohttp.ClientSession() as http, http.ws_connect(server.ws_url) as ws:
        await ws.send_json(
            {
                "type": "response.create",
                "model": "sim-coding-agent",
                "rollout_mode": "append",
                "input": "Fix the failing tests.",
                "tools": CODING_TOOLS,
                "store": False,
            }
        )
        events = await read_until(ws, "response.done")
        done = events[-1]
        response_id = done["response"]["id"]
        sequence = [e["sequence_number"] for e in events]
        appended_tokens: list[int] = []
        for _ in CODING_AGENT_STEPS:
            assert done["type"] == "response.done"
            assert done["response"]["id"] == response_id
            (pending,) = done["pending_calls"]
            output = _output_for(pending["call_id"])
            appended_tokens.append(len(render_item(parse_input([output])[0])))
            await ws.send_json(
                {"type": "response.append", "response_id": response_id, "input": [output]}
            )
            events = await read_until(ws, "response.done", "response.completed")
            done = events[-1]
            sequence += [e["sequence_number"] for e in events]
        assert done["type"] == "response.completed"
        assert done["response"]["id"] == response_id
        assert sequence == list(range(len(sequence)))  # one response, numbering continues
        calls = [o for o in done["response"]["output"] if o["type"] == "function_call"]
        assert len(calls) == len(CODING_AGENT_STEPS)
        usage = done["response"]["usage"]
        assert usage["input_tokens_details"]["cached_tokens"] > 0

    await server.engine.post.stop()  # drain post-inference so the ledger is complete
    (record,) = server.engine.post.records_for(response_id)
    runs = record.stage_runs
    assert runs["validate.full"] == 1 and runs["render.full"] == 1  # pre-inference once
    assert runs["validate.incremental"] == len(CODING_AGENT_STEPS)  # one per append
    assert record.samples == len(CODING_AGENT_STEPS) + 1
    assert server.engine.post.runs == 1  # post-inference once for the whole rollout
    # each resume rendered exactly the appended item's tokens, never the history
    assert record.resume_tokens == appended_tokens
    assert record.stage_tokens["incremental"] == sum(appended_tokens)


async def test_append_errors_keep_rollout_waiting(server: LiveServer) -> None:
    tools = [WEATHER_LOOSE]
    async with aiohttp.ClientSession() as http, http.ws_connect(server.ws_url) as ws:
        await ws.send_json(
            {
                "type": "response.create",
                "rollout_mode": "append",
                "input": "Weather in Paris?",
                "tools": tools,
            }
        )
        done = (await read_until(ws, "response.done"))[-1]
        rid, call_id = done["response"]["id"], done["pending_calls"][0]["call_id"]
        bad = [
            ({"response_id": "resp_nope", "input": [_output_for(call_id)]}, "response_not_found"),
            ({"response_id": rid, "input": [_output_for("call_wrong")]}, "unknown_call_id"),
            (
                {"response_id": rid, "input": [{"role": "user", "content": "hi"}]},
                "invalid_append_input",
            ),
        ]
        for body, code in bad:
            await ws.send_json({"type": "response.append", **body})
            error = await next_event(ws)
            assert error["type"] == "error" and error["error"]["code"] == code
            assert isinstance(error["status"], int)
        await ws.send_json(
            {"type": "response.inject", "response_id": rid, "input": [_output_for(call_id)]}
        )
        ack = await next_event(ws)
        assert ack["type"] == "response.inject.created" and ack["response_id"] == rid
        final = (await read_until(ws, "response.completed"))[-1]
        assert final["response"]["output"][-1]["type"] == "message"
        await ws.send_json(
            {"type": "response.append", "response_id": rid, "input": [_output_for(call_id)]}
        )
        error = await next_event(ws)
        assert error["type"] == "error"
        assert error["error"]["code"] == "response_already_completed"


async def test_an_append_answering_a_terminal_frame_still_in_its_send_is_already_completed(
    server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """APPEND-5: the terminal frame is on the wire while its send still waits (a socket
    draining); an append sent on reading it is ``response_already_completed``, not
    ``response_not_waiting``, and names no lane (the live fuzzer: seeds 3875029879 for
    steering, 545521638 for the lane of this error)."""
    terminal = HeldTerminal(monkeypatch)
    async with aiohttp.ClientSession() as http, http.ws_connect(server.ws_url) as ws:
        await ws.send_json(
            {
                "type": "response.create",
                "model": "sim",
                "rollout_mode": "append",
                "input": "Say hello.",
                "store": False,
                "stream_id": "lane-a",
            }
        )
        final = (await read_until(ws, "response.completed"))[-1]
        assert terminal.held.is_set()
        await ws.send_json(
            {
                "type": "response.append",
                "response_id": final["response"]["id"],
                "input": [_output_for("call_x")],
            }
        )
        error = await next_event(ws)
        terminal.release()
        assert error["type"] == "error"
        assert error["error"]["code"] == "response_already_completed", error
        assert "stream_id" not in error, error  # as after the lane heard (the live fuzzer)


async def test_an_append_during_the_terminal_events_durable_write_is_refused_after_it(
    server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """APPEND-5: between a response's terminal event being built and its frame being sent
    comes its durable write (STORE-6). An append arriving then is refused as already
    completed, but only after the terminal frame (as a steer is, STEER-7)."""
    write = HeldWrite(monkeypatch, server.engine.store, "append")
    async with aiohttp.ClientSession() as http, http.ws_connect(server.ws_url) as ws:
        create = {"type": "response.create", "model": "sim", "rollout_mode": "append"}
        await ws.send_json({**create, "input": "Say hello.", "store": True})
        created = await next_event(ws)
        await wait_for(write.held.is_set, "the terminal event's durable write")
        response_id = created["response"]["id"]
        append = {"type": "response.append", "response_id": response_id}
        await ws.send_json({**append, "input": [_output_for("call_x")]})
        await wait_for(write.read.is_set, "the server to read the append")
        write.release()
        events = [await next_event(ws)]
        while events[-1]["type"] != "error":
            events.append(await next_event(ws))
    assert events[-2]["type"] == "response.completed", [e["type"] for e in events]
    assert events[-1]["error"]["code"] == "response_already_completed", events[-1]
