"""Remote MCP tools through the openai SDK over HTTP, SSE and WebSocket, against real MCP
servers: the ``mcp`` SDK's own (Streamable HTTP and SSE) and the reference
``@modelcontextprotocol/server-everything`` (SPEC §18)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from openai import AsyncOpenAI, BadRequestError

from engine.core import EngineConfig
from tests.support.fixtures import sdk_client
from tests.support.mcp import everything_server, sdk_server


def _config(**kwargs: Any) -> EngineConfig:
    return EngineConfig(tokens_per_second=0, mcp_allow_hosts="127.0.0.1", **kwargs)


def _mcp(url: str, **kwargs: Any) -> Any:
    return {"type": "mcp", "server_label": "calc", "server_url": url, **kwargs}


async def test_http_lists_calls_and_answers(server_factory: Any) -> None:
    """MCP-4, MCP-6, MCP-7: the first turn lists the server's tools (an ``mcp_list_tools``
    item, only the allowed ones), the model's call of one runs inside the rollout (an
    ``mcp_call`` item with the server's output) and the model answers from it, in one
    response."""
    live = await server_factory(_config())
    async with sdk_server() as mcp, sdk_client(live) as client:
        tool = _mcp(mcp.url, require_approval="never", allowed_tools=["add", "echo"])
        response = await client.responses.create(
            model="sim", input="please add 2 and 3", tools=[tool]
        )
    kinds = [item.type for item in response.output]
    assert kinds == ["mcp_list_tools", "mcp_call", "message"], kinds
    listed, call = response.output[0], response.output[1]
    assert listed.type == "mcp_list_tools" and [t.name for t in listed.tools] == ["add", "echo"]
    assert call.type == "mcp_call" and call.name == "add" and call.error is None
    assert call.status == "completed" and call.server_label == "calc"
    assert call.output is not None and call.output.lstrip("-").isdigit()
    assert call.output in response.output_text


async def test_sse_event_order(server_factory: Any) -> None:
    """MCP-5, MCP-7 (ORD-5): a listing is ``output_item.added`` → ``mcp_list_tools.in_progress``
    → ``.completed`` → ``output_item.done``; a call is ``output_item.added`` →
    ``mcp_call.in_progress`` → ``mcp_call_arguments.delta``+ → ``.done`` →
    ``mcp_call.completed`` → ``output_item.done``, all on one ``output_index`` each. The
    server here speaks the older SSE transport (MCP-12)."""
    live = await server_factory(_config())
    async with sdk_server("sse") as mcp, sdk_client(live) as client:
        stream = await client.responses.create(
            model="sim",
            input="use echo",
            tools=[_mcp(mcp.url, require_approval="never")],
            stream=True,
        )
        events = [event async for event in stream]
    kinds = [e.type for e in events]
    listing = kinds[2:6]
    assert listing == [
        "response.output_item.added",
        "response.mcp_list_tools.in_progress",
        "response.mcp_list_tools.completed",
        "response.output_item.done",
    ], kinds
    call = [k for k in kinds[6:] if "mcp_call" in k or "output_item" in k][:4]
    assert call[:3] == [
        "response.output_item.added",
        "response.mcp_call.in_progress",
        "response.mcp_call_arguments.delta",
    ], kinds
    after = kinds[kinds.index("response.mcp_call_arguments.done") :]
    assert after[:3] == [
        "response.mcp_call_arguments.done",
        "response.mcp_call.completed",
        "response.output_item.done",
    ], kinds
    done = [e for e in events if e.type == "response.output_item.done"]
    assert done[1].item.type == "mcp_call"
    assert (done[1].item.output or "").startswith("echo: ")
    indexes = {e.output_index for e in events[2:6] if hasattr(e, "output_index")}
    assert indexes == {0}
    assert events[-1].type == "response.completed"


async def test_continuation_does_not_list_again(server_factory: Any) -> None:
    """MCP-4: a continuation (``previous_response_id``) finds the listing in its context and
    calls the server without listing it again."""
    live = await server_factory(_config())
    async with sdk_server() as mcp, sdk_client(live) as client:
        tools = [_mcp(mcp.url, require_approval="never")]
        first = await client.responses.create(model="sim", input="use echo", tools=tools)
        second = await client.responses.create(
            model="sim", input="use add now", tools=tools, previous_response_id=first.id
        )
    assert first.output[0].type == "mcp_list_tools"
    assert [i.type for i in second.output] == ["mcp_call", "message"]
    assert second.output[0].type == "mcp_call" and second.output[0].name == "add"


async def test_everything_server(server_factory: Any) -> None:
    """MCP-12, MCP-17: the reference server from npm, over Streamable HTTP: its tools listed,
    its ``echo`` called."""
    live = await server_factory(_config())
    async with everything_server() as mcp, sdk_client(live) as client:
        tool = _mcp(mcp.url, require_approval="never", allowed_tools=["echo", "get-sum"])
        response = await client.responses.create(model="sim", input="use echo", tools=[tool])
    listed = response.output[0]
    assert listed.type == "mcp_list_tools" and {t.name for t in listed.tools} == {
        "echo",
        "get-sum",
    }
    call = response.output[1]
    assert call.type == "mcp_call" and call.name == "echo" and call.error is None
    assert call.output is not None and "Echo" in call.output


async def test_connector_and_tunnel_are_refused(server: Any, client: AsyncOpenAI) -> None:
    """MCP-2: ``connector_id`` and ``tunnel_id`` are a 400 naming the field, before any
    event."""
    for field in ("connector_id", "tunnel_id"):
        tool = {"type": "mcp", "server_label": "x", field: "connector_gmail"}
        with pytest.raises(BadRequestError) as caught:
            await client.responses.create(model="sim", input="hi", tools=[tool])
        body: Any = caught.value.body
        assert body["code"] == "unsupported_parameter" and body["param"] == f"tools[0].{field}"
    with pytest.raises(BadRequestError) as caught:
        await client.responses.create(
            model="sim", input="hi", tools=[{"type": "mcp", "server_label": "x"}]
        )
    body = caught.value.body
    assert body["code"] == "missing_required_parameter"
    assert body["param"] == "tools[0].server_url"


async def test_private_addresses_are_refused(server_factory: Any) -> None:
    """MCP-10, MCP-11: without the operator's allowlist a loopback server is never contacted:
    the listing fails (``mcp_list_tools.failed``, the item's ``error``), nothing is offered,
    and the response goes on. ``localhost`` and a private address are refused alike."""
    live = await server_factory(EngineConfig(tokens_per_second=0))
    async with sdk_server() as mcp, sdk_client(live) as client:
        for url in (mcp.url, mcp.url.replace("127.0.0.1", "localhost"), "http://10.1.2.3/mcp"):
            stream = await client.responses.create(
                model="sim", input="use echo", tools=[_mcp(url)], stream=True
            )
            events = [event async for event in stream]
            kinds = [e.type for e in events]
            assert "response.mcp_list_tools.failed" in kinds, kinds
            final = events[-1]
            assert final.type == "response.completed"
            listed = final.response.output[0]
            assert listed.type == "mcp_list_tools" and listed.tools == []
            assert listed.error is not None and "mcp-allow-hosts" in listed.error
            assert [i.type for i in final.response.output] == ["mcp_list_tools", "message"]


async def test_ws_both_stores(server_factory: Any) -> None:
    """MCP-7 over WebSocket, with ``store`` false (the connection's cache) and true (the
    store): the call runs inside the rollout and its continuation lists nothing again."""
    live = await server_factory(_config())
    async with sdk_server() as mcp, sdk_client(live) as client:
        tools = [_mcp(mcp.url, require_approval="never")]
        for store in (False, True):
            async with client.responses.connect() as conn:
                await conn.response.create(model="sim", input="use add", tools=tools, store=store)
                first = await _completed(conn)
                await conn.response.create(
                    model="sim",
                    input="use echo",
                    tools=tools,
                    store=store,
                    previous_response_id=first.id,
                )
                second = await _completed(conn)
            assert [i.type for i in first.output] == ["mcp_list_tools", "mcp_call", "message"]
            assert [i.type for i in second.output] == ["mcp_call", "message"]


async def _completed(conn: Any) -> Any:
    async for event in conn:
        if event.type == "response.completed":
            return event.response
        assert event.type not in ("error", "response.failed"), event
    raise AssertionError("the socket closed")


def test_under_uvloop() -> None:
    """MCP-12: the SDK's anyio sessions, each in its own task, run on uvloop (as ``rollout
    serve`` runs) beside aiohttp: a listing and a call, and the sessions close with the
    rollout."""
    import uvloop

    from tests.support.server import start_server

    async def scenario() -> list[str]:
        live = await start_server(_config())
        try:
            async with sdk_server() as mcp, sdk_client(live) as client:
                tool = _mcp(mcp.url, require_approval="never")
                response = await client.responses.create(model="sim", input="use add", tools=[tool])
        finally:
            await live.runner.cleanup()
        assert "uvloop" in type(asyncio.get_running_loop()).__module__
        return [item.type for item in response.output]

    assert uvloop.run(scenario()) == ["mcp_list_tools", "mcp_call", "message"]
