"""Real MCP servers for the remote MCP tests (SPEC §18), each its own process on a loopback port
it picks itself (port 0), found where it listens (``listening_ports``): the ``mcp`` SDK's server
(``tests/support/mcp_server.py``, Streamable HTTP or SSE) and
``@modelcontextprotocol/server-everything`` from npm (installed by ``.ci/sysdeps`` into
``.tools/``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from tests.support.server import listening_ports
from tests.support.wait import wait_for

ROOT = Path(__file__).resolve().parents[2]
EVERYTHING = (
    ROOT
    / ".tools"
    / "mcp-everything"
    / "node_modules"
    / "@modelcontextprotocol"
    / "server-everything"
)


@dataclass
class McpProcess:
    url: str
    process: asyncio.subprocess.Process

    async def calls(self) -> dict[str, int]:
        """The ``mcp`` SDK server's count of the tool calls it received, per tool name, read
        from the server itself (``GET /calls``, ``tests/support/mcp_server.py``): "ran once" and
        "never called" are counted at the far side (MCP-9)."""
        base = self.url.rsplit("/", 1)[0]
        async with aiohttp.ClientSession() as http, http.get(f"{base}/calls") as resp:
            assert resp.status == 200, resp.status
            counts: dict[str, int] = await resp.json()
        return counts

    async def kill(self) -> None:
        """The server dies (a test of MCP-8): killed, and reaped."""
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        await self.process.wait()


async def _port_of(process: asyncio.subprocess.Process) -> int:
    """The port the server process listens on, once it does."""

    def listening() -> int | None:
        if process.returncode is not None:
            raise AssertionError(f"the MCP server exited with {process.returncode}")
        ports = listening_ports(process.pid)
        return min(ports) if ports else None

    port = await wait_for(listening, "the MCP server to listen", limit=30)
    assert isinstance(port, int)
    return port


@contextlib.asynccontextmanager
async def _process(args: list[str], path: str, env: dict[str, str]) -> AsyncIterator[McpProcess]:
    process = await asyncio.create_subprocess_exec(
        *args,
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        port = await _port_of(process)
        yield McpProcess(f"http://127.0.0.1:{port}{path}", process)
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                async with asyncio.timeout(5):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()


@contextlib.asynccontextmanager
async def sdk_server(
    transport: str = "streamable-http", *, any_host: bool = False
) -> AsyncIterator[McpProcess]:
    """The ``mcp`` SDK's server: ``/mcp`` (Streamable HTTP) or ``/sse`` (SSE); ``any_host``
    accepts any ``Host`` header (a test reaching it by a name of its own)."""
    path = "/sse" if transport == "sse" else "/mcp"
    args = [sys.executable, "-m", "tests.support.mcp_server", "0", transport]
    if any_host:
        args.append("any-host")
    async with _process(args, path, {}) as server:
        yield server


@contextlib.asynccontextmanager
async def everything_server() -> AsyncIterator[McpProcess]:
    """``@modelcontextprotocol/server-everything`` over Streamable HTTP (``/mcp``)."""
    script = EVERYTHING / "dist" / "index.js"
    args = ["node", str(script), "streamableHttp"]
    async with _process(args, "/mcp", {"PORT": "0"}) as server:
        yield server
