"""Which MCP servers the engine may reach (SPEC: MCP-10, MCP-11).

A ``server_url`` is fetched by this process, so without a rule the engine is an open proxy into
its own network: a URL whose host is (or resolves to) a loopback, link-local, private, shared,
multicast, reserved or unspecified address is refused unless the operator allows that host
(``--mcp-allow-hosts``: host names, addresses or networks)."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass, field
from urllib.parse import urlsplit

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class McpLimits:
    """From ``EngineConfig`` (CFG-6): one call's (and one listing's) time, its output's size
    (MCP-8, MCP-13), the operator's allowlist (MCP-10)."""

    call_timeout_s: float
    max_output_bytes: int
    hosts: HostPolicy


class Refused(Exception):
    """The URL may not be fetched; the message names why, never a header."""


@dataclass(frozen=True)
class HostPolicy:
    """The operator's allowlist: exact host names and networks (an address is a /32 or /128)."""

    names: frozenset[str] = frozenset()
    networks: tuple[Network, ...] = field(default=())

    @classmethod
    def parse(cls, text: str) -> HostPolicy:
        names: set[str] = set()
        networks: list[Network] = []
        for entry in (e.strip() for e in text.split(",")):
            if not entry:
                continue
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                names.add(entry.lower().rstrip("."))
        return cls(frozenset(names), tuple(networks))

    def allows(self, host: str, address: Address) -> bool:
        if host in self.names:
            return True
        return any(address in network for network in self.networks)


def internal(address: Address) -> bool:
    """An address the public internet does not route to this host's neighbours (MCP-10)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return (
        address.is_loopback
        or address.is_link_local
        or address.is_private
        or address.is_multicast
        or address.is_reserved
        or address.is_unspecified
        or (isinstance(address, ipaddress.IPv4Address) and address in _SHARED)
    )


_SHARED = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT


async def check_url(url: str, policy: HostPolicy) -> None:
    """Raises ``Refused`` for a URL the engine may not fetch (MCP-10, MCP-11)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise Refused("server_url must be an http or https URL.")
    host = (parts.hostname or "").lower().rstrip(".")
    if not host:
        raise Refused("server_url has no host.")
    for address in await _addresses(host, parts.port or (443 if parts.scheme == "https" else 80)):
        if internal(address) and not policy.allows(host, address):
            raise Refused(
                f"server_url host {host!r} is a loopback, link-local or private address; "
                "the operator has not allowed it (--mcp-allow-hosts)."
            )


async def _addresses(host: str, port: int) -> list[Address]:
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        raise Refused(f"server_url host {host!r} does not resolve.") from None
    return [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]
