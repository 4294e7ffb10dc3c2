"""Listed MCP tools are offered to chat and Responses upstreams as plain functions, in each
one's own format, and the call's round trip reaches them as a function call and its output;
the ``mcp`` tool itself (a server URL, perhaps headers) is never forwarded (SPEC: MCP-3,
MCP-6)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.fixtures import sdk_client
from tests.support.mcp import sdk_server
from tests.upstream.conftest import StartEngine, router_for
from tests.upstream.peer import ChatPeer, ResponsesPeer


@pytest.mark.parametrize("backend", ["chat", "responses"])
async def test_upstreams_see_functions(
    backend: str,
    chat_peer: ChatPeer,
    responses_peer: ResponsesPeer,
    engine_for: StartEngine,
) -> None:
    peer = chat_peer if backend == "chat" else responses_peer
    live = await engine_for(router_for(backend, peer.base_url), mcp_allow_hosts="127.0.0.1")
    async with sdk_server() as mcp, sdk_client(live) as client:
        tool: Any = {
            "type": "mcp",
            "server_label": "calc",
            "server_url": mcp.url,
            "require_approval": "never",
            "allowed_tools": ["weather"],
            "authorization": "tok-never-forwarded",
        }
        response = await client.responses.create(model="gpt-up", input="Weather?", tools=[tool])
    assert [i.type for i in response.output] == ["mcp_list_tools", "mcp_call", "message"]
    assert response.output_text == "Tool said: sunny in Paris"
    first, second = (r.body for r in peer.requests)
    if backend == "chat":
        assert [t["function"]["name"] for t in first["tools"]] == ["weather"]
        roles = [m["role"] for m in second["messages"]]
        assert roles[-2:] == ["assistant", "tool"]
        assert second["messages"][-1]["content"] == "sunny in Paris"
    else:
        assert [(t["type"], t["name"]) for t in first["tools"]] == [("function", "weather")]
        kinds = [i.get("type") for i in second["input"]]
        assert kinds[-2:] == ["function_call", "function_call_output"]
        assert second["input"][-1]["output"] == "sunny in Paris"
    assert "tok-never-forwarded" not in str([r.body for r in peer.requests])
    assert "mcp_list_tools" not in str([r.body for r in peer.requests])
