"""Remote MCP tools on a resumed rollout: an HTTP chain's parked one (PARK-4, PARK-3) and a
WebSocket's suspended one (COMPAT-2, append mode) answer as a new rollout over the same context
does (the hydration path, parking off): a step that ran an MCP call and asked the client for a
function call samples once more when the output comes (MCP-7), and a continuation's own faults
are the ones every path reports (MCP-18, VAL-1 before VAL-5). The MCP server counts its calls.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from engine.core import EngineConfig
from tests.support.fixtures import sdk_client
from tests.support.mcp import McpProcess, sdk_server
from tests.support.ws import turn

LOOKUP = {
    "type": "function",
    "name": "lookup",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
}


def _config(**kwargs: Any) -> EngineConfig:
    return EngineConfig(tokens_per_second=0, mcp_allow_hosts="127.0.0.1", **kwargs)


def _tools(mcp: McpProcess, approval: str = "never") -> list[Any]:
    server = {"type": "mcp", "server_label": "calc", "server_url": mcp.url}
    return [{**server, "require_approval": approval}, LOOKUP]


def _output(call: Any) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call.call_id, "output": "found"}


async def _mixed_chain(live: Any, mcp: McpProcess) -> tuple[Any, Any]:
    """MCP-7: a step with an MCP call and a client function call, then the function's output
    by ``previous_response_id``."""
    async with sdk_client(live) as client:
        tools = _tools(mcp)
        first = await client.responses.create(
            model="sim", input="use echo and lookup", tools=tools, parallel_tool_calls=True
        )
        assert [i.type for i in first.output] == ["mcp_list_tools", "function_call", "mcp_call"]
        answer = [_output(first.output[1])]
        second = await client.responses.create(
            model="sim", input=answer, tools=tools, previous_response_id=first.id
        )
    return first, second


async def test_mixed_step_resumed_from_an_http_chain(server_factory: Any) -> None:
    """MCP-7 with PARK-4: the chain's parked rollout resumes (``create.unparked``) and answers
    in one message, exactly as a server with parking off answers from the hydration cache
    (HYD-1); the MCP server ran each chain's call once."""
    parked = await server_factory(_config())
    reference = await server_factory(_config(park_seconds=0))
    async with sdk_server() as mcp:
        first, second = await _mixed_chain(parked, mcp)
        assert await mcp.calls() == {"echo": 1}
        _, again = await _mixed_chain(reference, mcp)
        assert await mcp.calls() == {"echo": 2}
    assert parked.engine.counters["create.unparked"] == 1
    assert reference.engine.counters["create.hydrated"] == 1
    assert reference.engine.counters["create.unparked"] == 0
    assert [i.type for i in second.output] == [i.type for i in again.output] == ["message"]
    assert second.output_text == again.output_text
    assert "found" in second.output_text
    assert (first.output[2].output or "-")[:10] in second.output_text


@pytest.mark.parametrize("mode", ["standard", "append"])
async def test_mixed_step_resumed_over_websocket(server_factory: Any, mode: str) -> None:
    """MCP-7 on a rollout resumed in place over WebSocket: the fast path (COMPAT-2) in a new
    response, or ``response.append`` in the same one (APPEND-3): one message follows the
    function's output."""
    live = await server_factory(_config())
    async with (
        sdk_server() as mcp,
        aiohttp.ClientSession() as http,
        http.ws_connect(live.ws_url) as ws,
    ):
        create = {"type": "response.create", "model": "sim", "input": "use echo and lookup",
                  "tools": _tools(mcp), "store": False, "rollout_mode": mode}  # fmt: skip
        done = (await turn(ws, create, "response.completed", "response.done"))[-1]["response"]
        call = done["output"][1]
        assert call["type"] == "function_call"
        answer = [{"type": "function_call_output", "call_id": call["call_id"], "output": "found"}]
        if mode == "standard":
            more = {**create, "input": answer, "previous_response_id": done["id"]}
        else:
            more = {"type": "response.append", "response_id": done["id"], "input": answer}
        events = await turn(ws, more, "response.completed")
        assert await mcp.calls() == {"echo": 1}
    new = events[-1]["response"]["output"][0 if mode == "standard" else 3 :]
    assert [item["type"] for item in new] == ["message"]
    if mode == "standard":
        assert live.engine.counters["create.fast_path"] == 1


async def test_a_resumed_rollout_reports_the_inputs_own_faults(server_factory: Any) -> None:
    """MCP-18 and VAL-1 with PARK-4 and COMPAT-2: a continuation of a parked HTTP chain, or of
    a WebSocket's suspended rollout, whose item names no request or call of the context is 400
    ``invalid_value`` / ``unknown_call_id`` at that item, as on the hydration path, not
    ``tool_output_missing``; the right answer then still runs the call once."""
    live = await server_factory(_config())
    async with (
        sdk_server() as mcp,
        aiohttp.ClientSession() as http,
        http.ws_connect(live.ws_url) as ws,
    ):
        tools, url = _tools(mcp, "always"), f"{live.base_url}/responses"
        body = {"model": "sim", "input": "use echo", "tools": tools}
        first = await (await http.post(url, json=body)).json()
        request = first["output"][-1]
        assert request["type"] == "mcp_approval_request"
        assert len(live.engine.parking) == 1  # parked (PARK-4)
        wrong = {"type": "mcp_approval_response", "approval_request_id": "mcpr_x", "approve": True}
        stray = {"type": "function_call_output", "call_id": "call_x", "output": "?"}
        faults = [([wrong], "invalid_value", "input[0].approval_request_id"),
                  ([stray], "unknown_call_id", "input[0].call_id")]  # fmt: skip
        for input, code, param in faults:
            more = {**body, "input": input, "previous_response_id": first["id"]}
            async with http.post(url, json=more) as resp:
                assert resp.status == 400
                error = (await resp.json())["error"]
            assert (error["code"], error["param"]) == (code, param), error
            create = {"type": "response.create", "store": False, **body}
            done = (await turn(ws, create, "response.completed"))[-1]["response"]
            (refused,) = await turn(
                ws, {**create, "input": input, "previous_response_id": done["id"]}, "error"
            )
            assert (refused["error"]["code"], refused["error"]["param"]) == (code, param)
        right = {**wrong, "approval_request_id": request["id"]}
        more = {**body, "input": [right], "previous_response_id": first["id"]}
        async with http.post(url, json=more) as resp:
            assert resp.status == 200, await resp.text()
            final = await resp.json()
        assert await mcp.calls() == {"echo": 1}
    assert [i["type"] for i in final["output"]] == ["mcp_call", "message"]
