"""Remote MCP flows: approval over HTTP and WebSocket, a turn mixing an MCP call with a client
function call, a server that dies mid-rollout, a slow or oversized answer, and secrets that
never leave the call (SPEC §18)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from engine.core import EngineConfig
from engine.store import open_store
from tests.support.fixtures import sdk_client
from tests.support.mcp import sdk_server
from tests.support.wait import wait_for
from tests.support.ws import turn

SECRET = "tok-5ecret-8f3a91d2"


def _config(**kwargs: Any) -> EngineConfig:
    return EngineConfig(tokens_per_second=0, mcp_allow_hosts="127.0.0.1", **kwargs)


def _mcp(url: str, **kwargs: Any) -> Any:
    return {"type": "mcp", "server_label": "calc", "server_url": url, **kwargs}


@pytest.mark.parametrize("approve", [True, False])
async def test_approval_over_http(server_factory: Any, approve: bool) -> None:
    """MCP-9: with approval required (the default) the response completes with an
    ``mcp_approval_request`` and nothing is called; a continuation by
    ``previous_response_id`` with an ``mcp_approval_response`` runs the call (an ``mcp_call``
    naming the request) or reports it denied with the reason, and the model answers. The
    server counts the calls it received: none while the approval is pending, exactly one once
    approved, none when denied."""
    live = await server_factory(_config())
    async with sdk_server() as mcp, sdk_client(live) as client:
        tools = [_mcp(mcp.url)]
        first = await client.responses.create(model="sim", input="use echo", tools=tools)
        assert [i.type for i in first.output] == ["mcp_list_tools", "mcp_approval_request"]
        request = first.output[1]
        assert request.type == "mcp_approval_request" and request.name == "echo"
        assert await mcp.calls() == {}  # pending: the server was never called
        answer = {
            "type": "mcp_approval_response",
            "approval_request_id": request.id,
            "approve": approve,
            "reason": "not today",
        }
        second = await client.responses.create(
            model="sim", input=[answer], tools=tools, previous_response_id=first.id
        )
        assert await mcp.calls() == ({"echo": 1} if approve else {})
    assert [i.type for i in second.output] == ["mcp_call", "message"]
    call = second.output[0]
    assert call.type == "mcp_call" and call.approval_request_id == request.id
    assert call.arguments == request.arguments
    if approve:
        assert call.error is None and (call.output or "").startswith("echo: ")
        assert (call.output or "-") in second.output_text
    else:
        assert call.output is None and call.status == "failed"
        assert call.error is not None and "not today" in json.dumps(call.error.model_dump())
        assert "denied" in second.output_text


async def test_approval_over_ws_and_stateless(server_factory: Any) -> None:
    """MCP-9, MCP-16: approval over WebSocket on the connection's cache (``store`` false), and
    by a stateless client that sends the whole history back (the request item replayed); the
    server receives the call only once each approval arrives, once per approval."""
    live = await server_factory(_config())
    async with sdk_server() as mcp, sdk_client(live) as client:
        tools = [_mcp(mcp.url, require_approval={"never": {"tool_names": ["add"]}})]
        async with client.responses.connect() as conn:
            await conn.response.create(model="sim", input="use echo", tools=tools, store=False)
            first = await _completed(conn)
            request = first.output[-1]
            assert request.type == "mcp_approval_request"
            assert await mcp.calls() == {}  # pending: never called
            answer = {
                "type": "mcp_approval_response",
                "approval_request_id": request.id,
                "approve": True,
            }
            await conn.response.create(
                model="sim",
                input=[answer],
                tools=tools,
                store=False,
                previous_response_id=first.id,
            )
            second = await _completed(conn)
        assert await mcp.calls() == {"echo": 1}
        assert [i.type for i in second.output] == ["mcp_call", "message"]
        assert (second.output[0].output or "").startswith("echo: ")
        history = [
            {"role": "user", "content": "use echo"},
            *[item.model_dump(exclude_none=True) for item in first.output],
            answer,
        ]
        stateless = await client.responses.create(
            model="sim", input=history, tools=tools, store=False
        )
        assert await mcp.calls() == {"echo": 2}  # the stateless approval ran it once more
    assert [i.type for i in stateless.output] == ["mcp_call", "message"]
    assert (stateless.output[0].output or "").startswith("echo: ")


async def test_mixed_with_client_function(server_factory: Any) -> None:
    """MCP-7: in one step the model calls an MCP tool and a client function: the MCP call runs
    inside the rollout, the function call waits for the client as always, and the answer reads
    both outputs."""
    live = await server_factory(_config())
    lookup = {
        "type": "function",
        "name": "lookup",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    }
    async with sdk_server() as mcp, sdk_client(live) as client:
        tools = [_mcp(mcp.url, require_approval="never"), lookup]
        first = await client.responses.create(
            model="sim", input="use echo and lookup", tools=tools, parallel_tool_calls=True
        )
        assert [i.type for i in first.output] == ["mcp_list_tools", "function_call", "mcp_call"]
        assert await mcp.calls() == {"echo": 1}
        call = first.output[1]
        assert call.type == "function_call"
        second = await client.responses.create(
            model="sim",
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "found"}],
            tools=tools,
            previous_response_id=first.id,
        )
        assert await mcp.calls() == {"echo": 1}  # the client's output runs nothing again
    assert [i.type for i in second.output] == ["message"]
    mcp_call = first.output[2]
    assert mcp_call.type == "mcp_call"
    mcp_output = mcp_call.output or "-"
    assert "found" in second.output_text and mcp_output[:10] in second.output_text


async def test_server_dies_mid_rollout(server_factory: Any) -> None:
    """MCP-8: the server dies between two calls of one rollout: the second ``mcp_call`` carries
    an ``error`` (``mcp_call.failed``), the model reads it, and the response completes."""
    live = await server_factory(_config())
    async with sdk_server() as mcp, sdk_client(live) as client:
        tools = [_mcp(mcp.url, require_approval="never")]
        first = await client.responses.create(model="sim", input="use echo", tools=tools)
        assert first.output[1].type == "mcp_call" and first.output[1].error is None
        await mcp.kill()
        stream = await client.responses.create(
            model="sim", input="use add", tools=tools, previous_response_id=first.id, stream=True
        )
        events = [event async for event in stream]
    kinds = [e.type for e in events]
    assert "response.mcp_call.failed" in kinds and kinds[-1] == "response.completed", kinds
    call = events[-1].response.output[0]
    assert call.type == "mcp_call" and call.status == "failed" and call.output is None
    assert call.error is not None and call.error.type == "mcp_protocol_error"
    assert "could not be reached" in events[-1].response.output_text


async def test_timeout_and_output_bound(server_factory: Any) -> None:
    """MCP-8, MCP-13: a call slower than ``mcp_call_timeout_s`` and an output larger than
    ``mcp_max_output_bytes`` are each an ``mcp_call`` with ``error``; the rollout goes on."""
    live = await server_factory(_config(mcp_call_timeout_s=1.0, mcp_max_output_bytes=10_000))
    never = {"never": {"tool_names": ["slow", "huge", "echo"]}}
    async with sdk_server() as mcp, sdk_client(live) as client:
        tools = [_mcp(mcp.url, require_approval=never, allowed_tools=["slow", "echo"])]
        slow = await client.responses.create(model="sim", input="use slow", tools=tools)
        huge = await client.responses.create(
            model="sim", input="use huge", tools=[_mcp(mcp.url, require_approval=never)]
        )
        after = await client.responses.create(
            model="sim", input="use echo", tools=tools, previous_response_id=slow.id
        )
    slow_call, huge_call = slow.output[1], huge.output[1]
    assert slow_call.type == "mcp_call" and slow_call.name == "slow"
    assert slow_call.error is not None and "in time" in slow_call.error.model_dump()["message"]
    assert slow.status == "completed"
    assert huge_call.type == "mcp_call" and huge_call.name == "huge" and huge_call.output is None
    # 20,000 bytes: over the output's bound, within the transport's (twice it plus 64 KiB)
    assert huge_call.error is not None
    assert huge_call.error.model_dump()["message"] == "The tool's output exceeds 10000 bytes."
    assert huge.status == "completed"
    assert after.output[0].type == "mcp_call" and after.output[0].error is None


async def test_secrets_never_leave_the_call(
    server_factory: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """MCP-3: ``authorization`` and ``headers`` reach the MCP server (it saw the token) and
    nothing else: not the response, its events, the stored records or the logs."""
    caplog.set_level(logging.DEBUG)
    db = tmp_path / "store.db"
    store = open_store(f"sqlite:///{db}")
    live = await server_factory(_config(), store=store)
    async with sdk_server() as mcp, sdk_client(live) as client:
        tool = _mcp(
            mcp.url,
            require_approval="never",
            authorization=SECRET,
            headers={"X-Api-Key": SECRET + "-h"},
        )
        stream = await client.responses.create(
            model="sim", input="use seen_headers", tools=[tool], stream=True
        )
        raw = [event.model_dump_json() async for event in stream]
        final = json.loads(raw[-1])["response"]
        fetched = await client.responses.retrieve(final["id"])
    call = final["output"][1]
    expected = [hashlib.sha256(v.encode()).hexdigest() for v in (f"Bearer {SECRET}", SECRET + "-h")]
    assert call["name"] == "seen_headers" and call["output"] == " ".join(expected)
    assert SECRET not in fetched.model_dump_json()
    for event in raw:
        assert SECRET not in event and "X-Api-Key" not in event, event
    await store.close()
    blob = b"".join(path.read_bytes() for path in sorted(tmp_path.iterdir()))  # noqa: ASYNC240
    assert blob and SECRET.encode() not in blob and b"X-Api-Key" not in blob
    assert SECRET not in caplog.text


async def _completed(conn: Any) -> Any:
    async for event in conn:
        if event.type == "response.completed":
            return event.response
        assert event.type not in ("error", "response.failed"), event
    raise AssertionError("the socket closed")


async def test_calls_per_response_are_bounded(server_factory: Any) -> None:
    """MCP-14: past ``mcp_max_calls`` calls in one response the model does not sample again:
    the response completes with the call's output in its context, for a continuation."""
    live = await server_factory(_config(mcp_max_calls=1))
    async with sdk_server() as mcp, sdk_client(live) as client:
        tools = [_mcp(mcp.url, require_approval="never")]
        first = await client.responses.create(model="sim", input="use echo", tools=tools)
        second = await client.responses.create(
            model="sim", input="and now?", tools=[], previous_response_id=first.id
        )
        assert await mcp.calls() == {"echo": 1}
    assert [i.type for i in first.output] == ["mcp_list_tools", "mcp_call"]
    assert first.status == "completed"
    assert first.output[1].type == "mcp_call" and first.output[1].error is None
    assert second.output_text.startswith("This is a simulated answer")


async def test_approval_in_append_mode(server_factory: Any) -> None:
    """MCP-9 in append mode (WebSocket): the approval request suspends the one response
    (``response.done`` names it among ``pending_calls``); a ``response.append`` of the
    ``mcp_approval_response`` resumes it, the call runs (the server receives it once, not
    before the answer) and the model answers, all in that response."""
    live = await server_factory(_config())
    async with (
        sdk_server() as mcp,
        aiohttp.ClientSession() as http,
        http.ws_connect(live.ws_url) as ws,
    ):
        create = {
            "type": "response.create",
            "model": "sim",
            "input": "use echo",
            "tools": [_mcp(mcp.url)],
            "store": False,
            "rollout_mode": "append",
        }
        done = await turn(ws, create, "response.done")
        (pending,) = done[-1]["pending_calls"]
        request = done[-1]["response"]["output"][-1]
        assert request["type"] == "mcp_approval_request" and pending["call_id"] == request["id"]
        assert await mcp.calls() == {}  # suspended on the approval: never called
        answer = {"type": "mcp_approval_response", "approval_request_id": request["id"]}
        append = {
            "type": "response.append",
            "response_id": done[-1]["response"]["id"],
            "input": [{**answer, "approve": True}],
        }
        events = await turn(ws, append, "response.completed")
        assert await mcp.calls() == {"echo": 1}
    final = events[-1]["response"]
    kinds = [item["type"] for item in final["output"]]
    assert kinds == ["mcp_list_tools", "mcp_approval_request", "mcp_call", "message"], kinds
    assert final["output"][2]["output"].startswith("echo: ")


async def test_an_answer_to_no_request_is_refused(server_factory: Any) -> None:
    """MCP-18: an ``mcp_approval_response`` naming no approval request of the context (nor of
    an earlier item of the input) is 400 ``invalid_value`` at
    ``input[i].approval_request_id``, over HTTP ``previous_response_id``, a stateless create
    and a WebSocket ``response.append``; nothing runs and the socket stays usable."""
    live = await server_factory(_config())
    async with (
        sdk_server() as mcp,
        aiohttp.ClientSession() as http,
        http.ws_connect(live.ws_url) as ws,
    ):
        tools = [_mcp(mcp.url)]
        url = f"{live.base_url}/responses"
        first = await (await http.post(url, json={"model": "sim", "input": "use echo",
                                                   "tools": tools})).json()  # fmt: skip
        wrong = {"type": "mcp_approval_response", "approval_request_id": "mcpr_x", "approve": True}
        bodies = [
            {"previous_response_id": first["id"], "input": [wrong]},
            {"input": [{"role": "user", "content": "use echo"}, wrong]},
        ]
        for body in bodies:
            async with http.post(url, json={"model": "sim", "tools": tools, **body}) as resp:
                assert resp.status == 400
                error = (await resp.json())["error"]
            assert error["code"] == "invalid_value", error
            assert error["param"] == f"input[{len(body['input']) - 1}].approval_request_id"
        create = {"type": "response.create", "model": "sim", "input": "use echo",
                  "tools": tools, "store": False, "rollout_mode": "append"}  # fmt: skip
        done = await turn(ws, create, "response.done")
        append = {"type": "response.append", "response_id": done[-1]["response"]["id"],
                  "input": [wrong]}  # fmt: skip
        (refused,) = await turn(ws, append, "error")
        assert refused["status"] == 400 and refused["error"]["code"] == "invalid_value"
        assert refused["error"]["param"] == "input[0].approval_request_id"
        request = done[-1]["response"]["output"][-1]
        right = {**wrong, "approval_request_id": request["id"]}
        events = await turn(ws, {**append, "input": [right]}, "response.completed")
    assert events[-1]["response"]["output"][-2]["type"] == "mcp_call"


async def test_a_replayed_approval_runs_once(server_factory: Any) -> None:
    """MCP-16: a stateless client replays a finished approval flow (request, response, the
    call that ran on it): the call is in the context as done and never runs again."""
    live = await server_factory(_config())
    async with sdk_server() as mcp, sdk_client(live) as client:
        tools = [_mcp(mcp.url)]
        first = await client.responses.create(model="sim", input="use echo", tools=tools)
        request = first.output[-1]
        assert request.type == "mcp_approval_request"
        answer: dict[str, Any] = {"type": "mcp_approval_response", "approve": True}
        answer["approval_request_id"] = request.id
        history: list[Any] = [{"role": "user", "content": "use echo"}]
        history += [item.model_dump(exclude_none=True) for item in first.output]
        history.append(answer)
        second = await client.responses.create(model="sim", input=history, tools=tools)
        history += [item.model_dump(exclude_none=True) for item in second.output]
        history.append({"role": "user", "content": "thanks"})
        third = await client.responses.create(model="sim", input=history, tools=tools)
        assert await mcp.calls() == {"echo": 1}  # counted at the server: never run again
    assert [i.type for i in second.output] == ["mcp_call", "message"]
    assert [i.type for i in third.output] == ["mcp_approval_request"]


def _sessions() -> list[asyncio.Task[Any]]:
    """The engine's MCP session tasks (the server runs in this test's loop)."""
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("mcp ") and not t.done()]


async def test_sessions_live_with_their_rollout(server_factory: Any) -> None:
    """MCP-12: one session per server per rollout, alive while the rollout waits for a client
    call, and closed when the rollout ends (here: its socket closes, and nothing parks it)."""
    live = await server_factory(_config(park_seconds=0))
    lookup = {"type": "function", "name": "lookup", "parameters": {"type": "object"}}
    async with sdk_server() as mcp, sdk_client(live) as client:
        tools = [_mcp(mcp.url, require_approval="never"), lookup]
        async with client.responses.connect() as conn:
            await conn.response.create(
                model="sim", input="use echo and lookup", tools=tools, store=False
            )
            first = await _completed(conn)
            assert [i.type for i in first.output] == ["mcp_list_tools", "function_call", "mcp_call"]
            assert len(_sessions()) == 1  # the rollout waits for lookup's output
        await wait_for(lambda: not _sessions(), "the MCP session to close with its rollout")


@pytest.mark.parametrize("transport", ["streamable-http", "sse"])
async def test_each_call_reaches_the_server_once(server_factory: Any, transport: str) -> None:
    """MCP-7, MCP-9: every call that needs no approval reaches the server exactly once: the
    server's own count per tool equals the ``mcp_call`` items the responses show, over HTTP
    (one call, parallel calls, a continuation) and WebSocket."""
    live = await server_factory(_config())
    async with sdk_server(transport) as mcp, sdk_client(live) as client:
        tools = [_mcp(mcp.url, require_approval="never")]
        one = await client.responses.create(model="sim", input="use echo", tools=tools)
        both = await client.responses.create(
            model="sim", input="use add and weather", tools=tools, parallel_tool_calls=True
        )
        then = await client.responses.create(
            model="sim", input="use echo", tools=tools, previous_response_id=both.id
        )
        async with client.responses.connect() as conn:
            await conn.response.create(model="sim", input="use weather", tools=tools, store=False)
            socket = await _completed(conn)
        counted = await mcp.calls()
    shown: dict[str, int] = {}
    for response in (one, both, then, socket):
        for item in response.output:
            if item.type == "mcp_call":
                assert item.error is None, item
                shown[item.name] = shown.get(item.name, 0) + 1
    assert shown == {"echo": 2, "add": 1, "weather": 2}, shown
    assert counted == shown
