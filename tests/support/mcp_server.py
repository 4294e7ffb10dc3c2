"""A real MCP server for the remote MCP tests (SPEC §18), built with the official ``mcp`` SDK
(``MCPServer``, the former FastMCP) and run as its own process: ``python -m
tests.support.mcp_server PORT streamable-http|sse``.

Tools: ``add`` (two integers), ``weather`` (a city), ``echo`` (a text), ``seen_headers``
(the sha256 digests of the ``authorization`` and ``x-api-key`` headers it was called with: a
test proves the secrets reached the server without the answer carrying them), ``fail`` (a tool
error), ``huge`` (20,000 bytes of text), ``slow`` (sleeps a minute)."""

from __future__ import annotations

import asyncio
import hashlib
import sys

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer(name="test-mcp")


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
    if transport == "sse":
        server.run("sse", host="127.0.0.1", port=port)
    else:
        server.run("streamable-http", host="127.0.0.1", port=port)


if __name__ == "__main__":
    main()
