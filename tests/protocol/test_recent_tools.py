"""CACHE-7: an HTTP create whose tools are the very bytes of a recent create's reuses that
create's checked toolset; any other tools are checked in full (errors of a fresh decode); a
toolset with an ``mcp`` tool is never remembered; the memory is bounded, in real bytes."""

from __future__ import annotations

import gc
import json
import tracemalloc
from typing import Any

import pytest

from protocol.codec import RecentTools, decode_create_body
from protocol.errors import ProtocolError
from tests.conformance.samples import AGENT_HEADERS, CUSTOM, FUNCTION

BAD_TOOL: dict[str, Any] = {"type": "function", "parameters": {"type": "object"}}  # no name
MCP: dict[str, Any] = {
    "type": "mcp",
    "server_label": "docs",
    "server_url": "https://mcp.example.com/sse",
    "headers": {"Authorization": "Bearer sk-secret"},
}


def body(tools: list[dict[str, Any]], text: str = "hi") -> bytes:
    return json.dumps({"model": "sim", "input": text, "tools": tools}).encode()


def test_the_same_tools_bytes_reuse_the_checked_toolset_and_its_echo() -> None:
    """CACHE-7: a later create with the same tools (other input) gets the very toolset object,
    its echo too; one changed byte builds a new one."""
    recent = RecentTools()
    first = decode_create_body(body([FUNCTION, CUSTOM]), recent)
    second = decode_create_body(body([FUNCTION, CUSTOM], "again"), recent)
    assert second.toolset is first.toolset and second.toolset.echo is first.toolset.echo
    changed = decode_create_body(body([FUNCTION, {**CUSTOM, "name": "apply"}]), recent)
    assert changed.toolset is not first.toolset
    assert changed.toolset.callables[1].name == "apply"
    assert len(recent) == 2


def test_tools_never_sent_before_are_checked_in_full() -> None:
    """CACHE-7: after good tools were remembered, a bad one is the error a fresh decode gives
    (status, code, message, param)."""
    with pytest.raises(ProtocolError) as fresh:
        decode_create_body(body([FUNCTION, BAD_TOOL]))
    recent = RecentTools()
    decode_create_body(body([FUNCTION, CUSTOM]), recent)
    with pytest.raises(ProtocolError) as again:
        decode_create_body(body([FUNCTION, BAD_TOOL]), recent)
    assert repr(again.value) == repr(fresh.value) and again.value.status == fresh.value.status
    assert str(fresh.value.param).startswith("tools[1]")


def test_an_mcp_toolset_is_not_remembered() -> None:
    """CACHE-7 (MCP-3): a toolset with an mcp tool keeps its headers with its request only."""
    recent = RecentTools()
    first = decode_create_body(body([FUNCTION, MCP]), recent)
    second = decode_create_body(body([FUNCTION, MCP]), recent)
    assert len(recent) == 0 and second.toolset is not first.toolset


def test_the_memory_is_bounded_in_toolsets_and_bytes() -> None:
    """CACHE-7: past ``max_items`` or ``max_bytes`` the least recently used goes first."""
    recent = RecentTools(max_items=2)
    tools = [[{**FUNCTION, "name": f"f{i}"}] for i in range(3)]
    kept = [decode_create_body(body(t), recent).toolset for t in tools]
    assert len(recent) == 2
    assert decode_create_body(body(tools[2]), recent).toolset is kept[2]
    assert decode_create_body(body(tools[0]), recent).toolset is not kept[0]  # evicted
    one = RecentTools()
    decode_create_body(body(tools[0]), one)
    small = RecentTools(max_bytes=one.nbytes * 3 // 2)  # room for one toolset, not two
    decode_create_body(body(tools[0]), small)
    decode_create_body(body(tools[1]), small)
    assert len(small) == 1 and small.nbytes <= small.max_bytes


@pytest.mark.parametrize("kit", ["two_functions", "coding_agent"])
def test_a_remembered_toolset_is_charged_what_it_holds(kit: str) -> None:
    """CACHE-7, MEM-10: ``nbytes`` is within 5% of what tracemalloc sees the remembered
    toolsets hold (not the requests': their bodies are gone)."""
    _, headers = AGENT_HEADERS["two_functions" if kit == "two_functions" else "agent_kit"]
    kept = [tool for tool in headers if tool["type"] != "mcp"]  # an mcp set is not kept
    bodies = [body([{**kept[0], "name": f"tool_{i}"}, *kept[1:]], "x" * 4096) for i in range(200)]
    recent = RecentTools(max_items=1_000, max_bytes=1 << 40)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for raw in bodies:
            decode_create_body(raw, recent)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(recent) == len(bodies)
    assert 0.95 <= recent.nbytes / held <= 1.05, (recent.nbytes, held)
