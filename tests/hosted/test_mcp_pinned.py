"""An MCP connection uses the address the host policy checked, never a second DNS answer
(SPEC MCP-11: DNS rebinding)."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from engine.core import EngineConfig
from tests.support.fixtures import sdk_client
from tests.support.mcp import sdk_server

NAME = "mcp.rebind.test"


class Rebinding:
    """The process's resolver for ``NAME`` (``socket.getaddrinfo``, under the event loop's
    ``getaddrinfo`` and every HTTP client's): the first answer is ``first``, every later one
    ``then``, the way a rebinding DNS server answers with a short TTL. Other names resolve as
    always."""

    def __init__(self, first: str, then: str) -> None:
        self.answers = [first]
        self.then = then
        self.asked = 0
        self._real = socket.getaddrinfo

    def __call__(self, host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else host
        if name != NAME:
            return self._real(host, port, *args, **kwargs)
        self.asked += 1
        address = self.answers.pop(0) if self.answers else self.then
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, int(port or 0)))]


@pytest.mark.parametrize("transport", ["streamable-http", "sse"])
async def test_the_connection_uses_the_checked_address(
    server_factory: Any, monkeypatch: pytest.MonkeyPatch, transport: str
) -> None:
    """MCP-11: the server's name resolves to an allowed address (127.0.0.1) for the check and
    to a refused one (127.0.0.2) afterwards: the session connects to the checked address (the
    server there receives the call, under its name in ``Host``) and nothing ever connects to
    the second, where a listener counts every connection."""
    trapped: list[str] = []

    def trap(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        trapped.append("connected")
        writer.close()

    live = await server_factory(EngineConfig(tokens_per_second=0, mcp_allow_hosts="127.0.0.1"))
    async with sdk_server(transport, any_host=True) as mcp:
        port = int(mcp.url.rsplit(":", 1)[1].split("/", 1)[0])
        trap_server = await asyncio.start_server(trap, "127.0.0.2", port)
        resolver = Rebinding("127.0.0.1", "127.0.0.2")
        monkeypatch.setattr(socket, "getaddrinfo", resolver)
        url = mcp.url.replace("127.0.0.1", NAME)
        tool = {"type": "mcp", "server_label": "calc", "server_url": url}
        async with trap_server, sdk_client(live) as client:
            response = await client.responses.create(
                model="sim", input="use echo", tools=[{**tool, "require_approval": "never"}]
            )
            monkeypatch.undo()
            counted = await mcp.calls()
    assert trapped == []  # nothing ever connected to the second answer
    assert [i.type for i in response.output] == ["mcp_list_tools", "mcp_call", "message"]
    call = response.output[1]
    assert call.type == "mcp_call" and call.error is None, call
    assert counted == {"echo": 1}
    assert resolver.asked == 1  # once, for the check
