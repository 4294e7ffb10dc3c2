"""Remote MCP tools through the openai SDK, against a real MCP server (SPEC §18)."""

from __future__ import annotations

from typing import Any

from engine.core import EngineConfig
from tests.support.fixtures import sdk_client
from tests.support.mcp import sdk_server


def _config(**kwargs: Any) -> EngineConfig:
    return EngineConfig(tokens_per_second=0, mcp_allow_hosts="127.0.0.1", **kwargs)


def _mcp(url: str, **kwargs: Any) -> dict[str, Any]:
    return {"type": "mcp", "server_label": "calc", "server_url": url, **kwargs}


async def test_http_lists_calls_and_answers(server_factory: Any) -> None:
    """MCP-4, MCP-5, MCP-6, MCP-7: the first turn lists the server's tools (an
    ``mcp_list_tools`` item), the model's call of one runs inside the rollout (an ``mcp_call``
    item with the server's output) and the model answers from it, in one response."""
    live = await server_factory(_config())
    async with sdk_server() as mcp, sdk_client(live) as client:
        tool = _mcp(mcp.url, require_approval="never", allowed_tools=["add"])
        response = await client.responses.create(
            model="sim",
            input="please add 2 and 3",
            tools=[tool],  # type: ignore[list-item]
        )
    kinds = [item.type for item in response.output]
    assert kinds == ["mcp_list_tools", "mcp_call", "message"], kinds
    listed, call = response.output[0], response.output[1]
    assert listed.type == "mcp_list_tools" and [t.name for t in listed.tools] == ["add"]
    assert call.type == "mcp_call" and call.name == "add" and call.error is None
    assert call.output is not None and call.output.isdigit()
    assert call.output in response.output_text
