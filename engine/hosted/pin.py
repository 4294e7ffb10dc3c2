"""An MCP session's HTTP client, pinned to the addresses the host policy checked (SPEC MCP-11).

``check_url`` resolves the server's host once and checks every address; were the HTTP client to
resolve the name again when it connects, a DNS answer that changed in between (rebinding: a
public address for the check, a loopback or private one for the connection) would reach what
the policy refused. So the client's connection pool gets a network backend that connects to the
pinned addresses only, in order, and to no other host: the URL keeps its name, so the ``Host``
header and TLS (SNI, the certificate's name) are the name's, while the socket goes to an address
that was checked. The client takes no proxy from the environment (a proxy would resolve the name
itself).

Imported when a session first connects, like the SDK (``engine/hosted/mcp.py``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import httpcore2
import httpx2

from engine.hosted.policy import Pin


class PinnedBackend(httpcore2.AsyncNetworkBackend):
    """Connects to the pin's addresses for the pin's host; refuses every other destination."""

    def __init__(self, url: str, pin: Pin) -> None:
        # the host as the HTTP client parsed the URL: a parser that read another host than the
        # policy's (urlsplit) connects nowhere
        self._host = httpx2.URL(url).raw_host.decode("ascii").lower().rstrip(".")
        self._pin = pin
        self._inner = httpcore2.AnyIOBackend()  # the SDK's transports run on anyio

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        if host.lower().rstrip(".") != self._host:
            raise httpcore2.ConnectError(f"{host!r} is not the checked MCP server host.")
        failure: Exception = httpcore2.ConnectError("The MCP server host has no address.")
        for address in self._pin.addresses:
            try:
                return await self._inner.connect_tcp(
                    str(address), port, timeout, local_address, socket_options
                )
            except (httpcore2.ConnectError, httpcore2.ConnectTimeout) as exc:
                failure = exc
        raise failure

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        raise httpcore2.ConnectError("An MCP server is reached over TCP only.")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class PinnedTransport(httpx2.AsyncHTTPTransport):
    """httpx's transport with its connection pool on a ``PinnedBackend`` (httpx takes no
    network backend of its own, so the pool is rebuilt with httpx's defaults)."""

    def __init__(self, url: str, pin: Pin) -> None:
        super().__init__(trust_env=False)
        limits = httpx2.Limits(max_connections=100, max_keepalive_connections=20)
        self._pool = httpcore2.AsyncConnectionPool(
            ssl_context=httpx2.create_ssl_context(trust_env=False),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=PinnedBackend(url, pin),
        )


def pinned_client(
    url: str,
    pin: Pin,
    headers: dict[str, str] | None = None,
    timeout: httpx2.Timeout | None = None,
    auth: httpx2.Auth | None = None,
) -> httpx2.AsyncClient:
    """``create_mcp_http_client``'s client (the SDK's ``McpHttpClientFactory``), pinned."""
    return httpx2.AsyncClient(
        headers=headers,
        timeout=timeout if timeout is not None else httpx2.Timeout(30.0, read=300.0),
        auth=auth,
        transport=PinnedTransport(url, pin),
    )
