"""A real MCP server for the remote MCP tests (SPEC §18), built with the official ``mcp`` SDK
(``MCPServer``, the former FastMCP) and run as its own process: ``python -m
tests.support.mcp_server PORT streamable-http|sse``.

Tools: ``add`` (two integers), ``echo`` (a text; it records the ``authorization`` header it was
called with in a file next to nothing else: ``seen_headers`` returns it, so a test can prove the
secret reached the server and nowhere else), ``fail`` (a tool error), ``big`` (``n`` bytes of
text), ``slow`` (sleeps ``seconds``)."""

from __future__ import annotations

import asyncio
import sys

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer(name="test-mcp")
_SEEN: list[str] = []


@server.tool(description="Add two integers.")
def add(a: int, b: int) -> str:
    return str(a + b)


@server.tool(description="Echo a text back.")
def echo(text: str, ctx: Context) -> str:
    request = ctx.request_context.request
    header = request.headers.get("authorization") if request is not None else None
    _SEEN.append(header or "")
    return f"echo: {text}"


@server.tool(description="The authorization headers the server was called with.")
def seen_headers() -> str:
    return "|".join(_SEEN)


@server.tool(description="Always fails.")
def fail(reason: str) -> str:
    raise ValueError(f"failed on purpose: {reason}")


@server.tool(description="A text of n bytes.")
def big(n: int) -> str:
    return "x" * n


@server.tool(description="Sleep, then answer.")
async def slow(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return "slept"


def main() -> None:
    port, transport = int(sys.argv[1]), sys.argv[2]
    if transport == "sse":
        server.run("sse", host="127.0.0.1", port=port)
    else:
        server.run("streamable-http", host="127.0.0.1", port=port)


if __name__ == "__main__":
    main()
