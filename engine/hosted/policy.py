"""Which MCP servers the engine may reach (SPEC: MCP-10, MCP-11).

A ``server_url`` is fetched by this process, so without a rule the engine is an open proxy into
its own network: a URL whose host is (or resolves to) a loopback, link-local, private, shared,
multicast, reserved or unspecified address is refused unless the operator allows that host
(``--mcp-allow-hosts``: host names, addresses or networks).

The check resolves the host once and answers the addresses it checked (a ``Pin``): the session's
HTTP client connects to those and never resolves the name again (``engine/hosted/pin.py``), so
a DNS answer that changes after the check (rebinding) cannot move the connection (MCP-11)."""

from __future__ import annotations

import asyncio
import ipaddress
import re
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
        """``--mcp-allow-hosts``: comma-separated networks (``10.0.0.0/8``), addresses
        (``127.0.0.1``, ``::1``, ``[::1]``) and host names; ``ValueError`` names an entry that is
        none of them (``10.0.0.0/33``, ``host:80``, a URL), which would otherwise allow nothing."""
        names: set[str] = set()
        networks: list[Network] = []
        for entry in (e.strip() for e in text.split(",")):
            if not entry:
                continue
            try:
                networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
            except ValueError:
                name = entry.lower().rstrip(".")
                if not _NAME.fullmatch(name) or len(name) > 253:
                    raise ValueError(
                        f"{entry!r} is not a host name, an address or a network"
                    ) from None
                names.add(name)
        return cls(frozenset(names), tuple(networks))

    def allows(self, host: str, address: Address) -> bool:
        """An allowed name, or an address in an allowed network (a v4-mapped IPv6 address is
        also its IPv4 address, as ``internal`` judges it)."""
        if host in self.names:
            return True
        forms: list[Address] = [address]
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            forms.append(address.ipv4_mapped)
        return any(form in network for form in forms for network in self.networks)


def internal(address: Address) -> bool:
    """An address the public internet does not route to this host's neighbours (MCP-10): an
    IPv6 address carrying an IPv4 one (v4-mapped ``::ffff:0:0/96``, 6to4 ``2002::/16``) is
    judged by the IPv4 address: whether 6to4 itself is private depends on the interpreter's
    copy of IANA's registry (3.11.2 lists ``2002::/16``; 3.11.7 does not)."""
    if isinstance(address, ipaddress.IPv6Address):
        carried = address.ipv4_mapped or address.sixtofour
        if carried is not None:
            return internal(carried)
        if address.is_site_local:  # fec0::/10: deprecated, still routed by some networks
            return True
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
_NAME = re.compile(r"(?!-)[a-z0-9_-]{1,63}(?<!-)(\.(?!-)[a-z0-9_-]{1,63}(?<!-))*")


def allow_hosts(text: str) -> str:
    """The ``--mcp-allow-hosts`` flag's reader: the text, once ``HostPolicy.parse`` takes it
    (a bad entry is a usage error, not a policy that silently allows nothing)."""
    HostPolicy.parse(text)
    return text


@dataclass(frozen=True)
class Pin:
    """A checked URL's host and the addresses the check resolved it to and allowed: the only
    addresses a connection to that host may use (MCP-11)."""

    host: str
    addresses: tuple[Address, ...]


async def check_url(url: str, policy: HostPolicy) -> Pin:
    """The addresses the URL's host may be reached at; ``Refused`` for a URL the engine may not
    fetch: one refused address refuses the host, whatever the others (MCP-10, MCP-11)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise Refused("server_url must be an http or https URL.")
    host = (parts.hostname or "").lower().rstrip(".")
    if not host:
        raise Refused("server_url has no host.")
    addresses = await _addresses(host, parts.port or (443 if parts.scheme == "https" else 80))
    for address in addresses:
        if internal(address) and not policy.allows(host, address):
            raise Refused(
                f"server_url host {host!r} is a loopback, link-local or private address; "
                "the operator has not allowed it (--mcp-allow-hosts)."
            )
    if not addresses:
        raise Refused(f"server_url host {host!r} does not resolve.")
    return Pin(host, tuple(dict.fromkeys(addresses)))


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
