"""A real MCP server for the remote MCP tests (SPEC §18), built with the official ``mcp`` SDK
(``MCPServer``, the former FastMCP) and run as its own process: ``python -m
tests.support.mcp_server PORT streamable-http|sse``.

Tools: ``add`` (two integers), ``weather`` (a city), ``echo`` (a text), ``seen_headers``
(the sha256 digests of the ``authorization`` and ``x-api-key`` headers it was called with: a
test proves the secrets reached the server without the answer carrying them), ``fail`` (a tool
error), ``huge`` (20,000 bytes of text), ``slow`` (sleeps a minute).

Every ``tools/call`` the server receives is counted per tool name as it arrives (before the tool
runs, so a call that fails or times out counts), and ``GET /calls`` answers the counts as JSON:
a test proves a call ran once, or never, at the far side (MCP-9). A third argument ``any-host``
turns off the SDK's Host-header check (its DNS-rebinding protection), for a test that reaches
the server by a name of its own (MCP-11)."""

from __future__ import annotations

import asyncio
import hashlib
import sys
from collections import Counter
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types import CallToolResult, InputRequiredResult
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

CALLS: Counter[str] = Counter()  # tool name -> calls received


class CountingServer(MCPServer):
    """Counts each tool call by name as the server receives it."""

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        CALLS[name] += 1
        return await super().call_tool(name, arguments, context)


server = CountingServer(name="test-mcp")


@server.custom_route("/calls", methods=["GET"])
async def calls(request: Request) -> Response:
    return JSONResponse(dict(CALLS))


@server.tool(description="Add two integers.")
def add(a: int, b: int) -> str:
    return str(a + b)


@server.tool(description="The weather in a city.")
def weather(city: str) -> str:
    return f"sunny in {city}"


@server.tool(description="Echo a text back.")
def echo(text: str) -> str:
    return f"echo: {text}"


@server.tool(description="Digests of the authorization headers of this call.")
def seen_headers(ctx: Context) -> str:
    request = ctx.request_context.request
    headers = request.headers if request is not None else {}
    seen = [headers.get("authorization", ""), headers.get("x-api-key", "")]
    return " ".join(hashlib.sha256(value.encode()).hexdigest() for value in seen)


@server.tool(description="Always fails.")
def fail(reason: str) -> str:
    raise ValueError(f"failed on purpose: {reason}")


@server.tool(description="A text of 20,000 bytes.")
def huge() -> str:
    return "x" * 20_000


@server.tool(description="Sleep a minute, then answer.")
async def slow() -> str:
    await asyncio.sleep(60)
    return "slept"


def main() -> None:
    port, transport = int(sys.argv[1]), sys.argv[2]
    security = None
    if sys.argv[3:] == ["any-host"]:
        security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
    if transport == "sse":
        server.run("sse", host="127.0.0.1", port=port, transport_security=security)
    else:
        server.run("streamable-http", host="127.0.0.1", port=port, transport_security=security)


if __name__ == "__main__":
    main()
