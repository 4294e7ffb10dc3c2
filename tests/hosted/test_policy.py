"""The host policy of remote MCP servers (``engine/hosted/policy.py``, SPEC MCP-10, MCP-11):
every special range refused in every written form, a name refused when any of its addresses
is, the operator's allowlist (``HostPolicy.parse``, ``allows``) and the pin a check answers."""

from __future__ import annotations

import argparse
import ipaddress
import socket
from typing import Any

import pytest

from engine.hosted.policy import HostPolicy, Pin, Refused, check_url, internal
from engine.server.process import flags

NONE = HostPolicy()

# (address, the range it stands for): every kind MCP-10 names, at both ends where it matters
REFUSED = [
    ("127.0.0.1", "loopback"),
    ("127.255.255.254", "loopback, its last host"),
    ("::1", "IPv6 loopback"),
    ("::ffff:127.0.0.1", "loopback, v4-mapped"),
    ("::ffff:10.1.2.3", "private, v4-mapped"),
    ("::ffff:100.64.0.1", "shared, v4-mapped"),
    ("2002:7f00:1::", "loopback inside 6to4"),
    ("2002:a9fe:a9fe::1", "link-local inside 6to4"),
    ("0.0.0.0", "unspecified"),
    ("::", "IPv6 unspecified"),
    ("0.1.2.3", "this network, 0/8"),
    ("10.0.0.0", "private 10/8"),
    ("10.255.255.255", "private 10/8, its end"),
    ("172.16.0.1", "private 172.16/12"),
    ("172.31.255.255", "private 172.16/12, its end"),
    ("192.168.0.1", "private 192.168/16"),
    ("192.168.255.255", "private 192.168/16, its end"),
    ("169.254.169.254", "link-local (cloud metadata)"),
    ("169.254.0.1", "link-local"),
    ("fe80::1", "IPv6 link-local"),
    ("fe80::1%1", "IPv6 link-local with a zone"),
    ("febf:ffff::1", "IPv6 link-local, the end of fe80::/10"),
    ("fec0::1", "IPv6 site-local"),
    ("100.64.0.0", "shared (CGNAT) 100.64/10, its start"),
    ("100.100.100.200", "shared (CGNAT, a cloud's metadata)"),
    ("100.127.255.255", "shared (CGNAT) 100.64/10, its end"),
    ("fc00::1", "unique local fc00::/7"),
    ("fd12:3456::1", "unique local fd00::/8"),
    ("224.0.0.1", "multicast"),
    ("239.255.255.250", "multicast (SSDP)"),
    ("ff02::1", "IPv6 multicast"),
    ("240.0.0.1", "reserved 240/4"),
    ("255.255.255.255", "broadcast"),
    ("192.0.2.1", "documentation (TEST-NET-1)"),
    ("198.18.0.1", "benchmarking 198.18/15"),
    ("2001:db8::1", "IPv6 documentation"),
    ("::7f00:1", "IPv4-compatible, reserved ::/8"),
    ("64:ff9b::7f00:1", "NAT64 of loopback, reserved ::/8"),
]

PUBLIC = [
    "8.8.8.8",
    "1.1.1.1",
    "100.63.255.255",  # just below 100.64/10
    "100.128.0.0",  # just above it
    "172.15.255.255",  # just below 172.16/12
    "172.32.0.0",  # just above it
    "192.169.0.1",
    "2606:4700:4700::1111",
    "::ffff:8.8.8.8",
    "2002:808:808::1",  # 6to4 of 8.8.8.8
]


def _url(address: str) -> str:
    host = f"[{address.replace('%', '%25')}]" if ":" in address else address
    return f"http://{host}:8080/mcp"


@pytest.mark.parametrize(("address", "kind"), REFUSED, ids=[a for a, _ in REFUSED])
async def test_every_special_range_is_refused(address: str, kind: str) -> None:
    """MCP-10: each kind of address the rule names is internal and its URL refused."""
    assert internal(ipaddress.ip_address(address)), kind
    with pytest.raises(Refused, match="--mcp-allow-hosts"):
        await check_url(_url(address), NONE)


@pytest.mark.parametrize("address", PUBLIC)
async def test_public_addresses_pass_and_are_pinned(address: str) -> None:
    """MCP-10, MCP-11: a public address passes, up to the edges of the refused ranges, and
    the check answers it as the pin."""
    assert not internal(ipaddress.ip_address(address))
    pin = await check_url(_url(address), NONE)
    assert pin == Pin(address, (ipaddress.ip_address(address),))


@pytest.mark.parametrize(
    "host",
    [
        "localhost",
        "LOCALHOST.",
        "127.1",  # the resolver's short forms of 127.0.0.1
        "2130706433",
        "0x7f.1",
        "0",
        "[::ffff:127.0.0.1]",
        "[0:0:0:0:0:ffff:7f00:1]",
        "[::1]",
        "[::]",
        "0.0.0.0",
        "user:pw@127.0.0.1",
    ],
)
async def test_every_written_form_of_loopback_is_refused(host: str) -> None:
    """MCP-10: a host that is, or resolves to, loopback or unspecified is refused however
    it is written (a name, the resolver's numeric shorthands, bracketed IPv6, v4-mapped)."""
    with pytest.raises(Refused):
        await check_url(f"http://{host}:9/mcp", NONE)


class Resolver:
    """``socket.getaddrinfo`` (under the event loop's) answering ``name`` with ``addresses``."""

    def __init__(self, name: str, addresses: list[str] | None) -> None:
        self.name, self.addresses = name, addresses
        self._real = socket.getaddrinfo

    def __call__(self, host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host != self.name:
            return self._real(host, port, *args, **kwargs)
        if self.addresses is None:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        family = {4: socket.AF_INET, 6: socket.AF_INET6}
        return [
            (family[ipaddress.ip_address(a).version], socket.SOCK_STREAM, 6, "", (a, port))
            for a in self.addresses
        ]


@pytest.mark.parametrize(
    "addresses",
    [
        ["8.8.8.8", "10.0.0.1"],
        ["10.0.0.1", "8.8.8.8"],
        ["2606:4700::1", "::1"],
        ["8.8.8.8", "100.64.0.1"],
        ["8.8.8.8", "::ffff:169.254.169.254"],
    ],
)
async def test_a_name_with_one_refused_address_is_refused(
    monkeypatch: pytest.MonkeyPatch, addresses: list[str]
) -> None:
    """MCP-10: a name resolving to several addresses is refused when any one is refused
    (a client connecting to another of them would reach the refused one)."""
    monkeypatch.setattr(socket, "getaddrinfo", Resolver("mcp.example.com", addresses))
    with pytest.raises(Refused, match=r"mcp\.example\.com"):
        await check_url("https://mcp.example.com/mcp", NONE)


async def test_a_name_is_pinned_to_every_checked_address(monkeypatch: pytest.MonkeyPatch) -> None:
    """MCP-10, MCP-11: a name whose addresses are all public (or allowed) is pinned to them,
    in the resolver's order, each once; an allowed network lets its addresses in."""
    answer = ["8.8.8.8", "2606:4700::1111", "8.8.8.8", "10.1.2.3"]
    monkeypatch.setattr(socket, "getaddrinfo", Resolver("mcp.example.com", answer))
    with pytest.raises(Refused):
        await check_url("https://mcp.example.com/mcp", NONE)
    pin = await check_url("https://MCP.example.com./mcp", HostPolicy.parse("10.0.0.0/8"))
    expected = [ipaddress.ip_address(a) for a in ("8.8.8.8", "2606:4700::1111", "10.1.2.3")]
    assert pin == Pin("mcp.example.com", tuple(expected))


async def test_urls_that_are_not_fetched(monkeypatch: pytest.MonkeyPatch) -> None:
    """MCP-10: only http and https URLs with a host are fetched; a name that does not
    resolve is refused (never a traceback)."""
    monkeypatch.setattr(socket, "getaddrinfo", Resolver("nowhere.example.com", None))
    for url in ("ftp://8.8.8.8/", "file:///etc/passwd", "gopher://8.8.8.8/", "http:///mcp", ""):
        with pytest.raises(Refused, match=r"http or https|no host"):
            await check_url(url, NONE)
    with pytest.raises(Refused, match="does not resolve"):
        await check_url("http://nowhere.example.com/mcp", NONE)


def test_parse_reads_names_addresses_and_networks() -> None:
    """MCP-10: ``--mcp-allow-hosts`` is comma-separated names (case and a final dot do not
    matter), addresses (a /32 or /128, IPv6 with or without brackets) and networks (host
    bits ignored); empty entries are nothing."""
    policy = HostPolicy.parse(" 127.0.0.1, 10.1.2.3/8 ,::1,[fd00::1],MCP.Internal.,, my_host ")
    assert policy.names == frozenset({"mcp.internal", "my_host"})
    assert [str(n) for n in policy.networks] == [
        "127.0.0.1/32",
        "10.0.0.0/8",
        "::1/128",
        "fd00::1/128",
    ]
    assert HostPolicy.parse("") == HostPolicy.parse(" , ,") == HostPolicy()


@pytest.mark.parametrize(
    "spec",
    ["10.0.0.0/33", "127.0.0.1:8080", "http://mcp.internal", "mcp internal", "-bad.example",
     "*.example.com", "a" * 64 + ".example", "mcp..internal", "256.1.1.1/8", "fe80::1/129"],
)  # fmt: skip
def test_parse_refuses_what_allows_nothing(spec: str) -> None:
    """MCP-10: an entry that is no name, address or network is an error (a usage error of
    ``rollout serve``), never a policy that silently allows nothing."""
    with pytest.raises(ValueError, match="not a host name"):
        HostPolicy.parse(f"127.0.0.1,{spec}")
    parser = argparse.ArgumentParser()
    flags.add_serve_parser(parser.add_subparsers(dest="command"))
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["serve", "--mcp-allow-hosts", spec])
    assert exit_.value.code == 2


def test_allows_by_exact_name_or_network() -> None:
    """MCP-10: ``allows`` takes an exact name (whatever it resolved to) or an address inside
    an allowed network; nothing else, and never a name's suffix or prefix."""
    policy = HostPolicy.parse("mcp.internal,10.0.0.0/8,::1,127.0.0.1")
    ip = ipaddress.ip_address
    assert policy.allows("mcp.internal", ip("192.168.1.1"))
    assert policy.allows("other", ip("10.200.0.1"))
    assert policy.allows("other", ip("::ffff:10.200.0.1"))  # v4-mapped: its IPv4 address
    assert policy.allows("localhost", ip("::1"))
    assert policy.allows("localhost", ip("127.0.0.1"))
    assert not policy.allows("localhost", ip("127.0.0.2"))
    assert not policy.allows("x.mcp.internal", ip("192.168.1.1"))
    assert not policy.allows("mcp.internal.evil", ip("192.168.1.1"))
    assert not policy.allows("other", ip("11.0.0.1"))
    assert not policy.allows("other", ip("::2"))
    assert not HostPolicy().allows("localhost", ip("127.0.0.1"))


async def test_an_allowed_host_passes_the_check() -> None:
    """MCP-10: the allowlist lets in exactly what it names: an allowed address, an address in
    an allowed network, an allowed name (here ``localhost``, resolved by the system)."""
    pin = await check_url("http://127.0.0.1:9/mcp", HostPolicy.parse("127.0.0.1"))
    assert pin == Pin("127.0.0.1", (ipaddress.ip_address("127.0.0.1"),))
    with pytest.raises(Refused):
        await check_url("http://127.0.0.2:9/mcp", HostPolicy.parse("127.0.0.1"))
    assert await check_url("http://[::ffff:127.0.0.2]/", HostPolicy.parse("127.0.0.0/8"))
    by_name = await check_url("http://localhost:9/mcp", HostPolicy.parse("localhost"))
    assert by_name.host == "localhost" and by_name.addresses
    assert all(a.is_loopback for a in by_name.addresses)
