"""The Agents SDK's ``HostedMCPTool`` end to end against a real MCP server, over HTTP and
WebSocket, with and without approval (SPEC §18: MCP-7, MCP-9)."""

from __future__ import annotations

from typing import Any

import pytest
from agents import (
    Agent,
    HostedMCPTool,
    MCPToolApprovalFunctionResult,
    MCPToolApprovalRequest,
    Runner,
    responses_websocket_session,
)
from agents.models.openai_responses import OpenAIResponsesModel

from engine.core import EngineConfig
from tests.support.agents_sdk import MODEL
from tests.support.fixtures import sdk_client
from tests.support.mcp import sdk_server


def _agent(url: str, model: Any = MODEL, approvals: Any = None, **tool: Any) -> Agent[Any]:
    config: Any = {"type": "mcp", "server_label": "calc", "server_url": url, **tool}
    hosted = HostedMCPTool(tool_config=config, on_approval_request=approvals)
    return Agent(name="mcp", instructions="Use the tools.", tools=[hosted], model=model)


@pytest.mark.parametrize("transport", ["http", "ws"])
async def test_hosted_mcp_without_approval(server_factory: Any, transport: str) -> None:
    """MCP-7: ``require_approval: never``: one run, the server's answer in the final output."""
    live = await server_factory(EngineConfig(tokens_per_second=0, mcp_allow_hosts="127.0.0.1"))
    async with sdk_server() as mcp:
        if transport == "http":
            async with sdk_client(live) as client:
                model = OpenAIResponsesModel(model=MODEL, openai_client=client)
                agent = _agent(mcp.url, model, require_approval="never")
                result = await Runner.run(agent, "use echo")
        else:
            async with responses_websocket_session(base_url=live.base_url, api_key="x") as ws:
                result = await ws.run(_agent(mcp.url, require_approval="never"), "use echo")
    assert "echo: " in str(result.final_output)
    kinds = [item.type for item in result.new_items]
    assert "mcp_list_tools_item" in kinds and "tool_call_item" in kinds, kinds
    assert len(result.raw_responses) == 1  # no client round trip


@pytest.mark.parametrize("approve", [True, False])
async def test_hosted_mcp_with_approval(server_factory: Any, approve: bool) -> None:
    """MCP-9: approval required: the SDK asks ``on_approval_request``, sends the
    ``mcp_approval_response`` in its next request, and the call runs (or is denied)."""
    live = await server_factory(EngineConfig(tokens_per_second=0, mcp_allow_hosts="127.0.0.1"))
    asked: list[str] = []

    def decide(request: MCPToolApprovalRequest) -> MCPToolApprovalFunctionResult:
        asked.append(request.data.name)
        return {"approve": approve, "reason": "checked by the test"}

    async with sdk_server() as mcp, sdk_client(live) as client:
        model = OpenAIResponsesModel(model=MODEL, openai_client=client)
        agent = _agent(mcp.url, model, decide, require_approval="always")
        result = await Runner.run(agent, "use echo")
    assert asked == ["echo"]
    final = str(result.final_output)
    if approve:
        assert "echo: " in final
    else:
        assert "denied" in final and "echo: " not in final
