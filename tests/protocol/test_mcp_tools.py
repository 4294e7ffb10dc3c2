"""The ``mcp`` tool as the codec reads it (SPEC: MCP-1..MCP-3), as properties over any tool a
client may send: secrets never reach the raw JSON the engine echoes, stores and forwards, and
connectors or tunnels are always a 400 naming the field; and the stream builder's hosted items
(MCP-5, MCP-7, ORD-8)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import events as ev
from protocol.errors import InvalidRequest
from protocol.items import McpCall, McpListTools
from protocol.response import Response
from protocol.stream import ResponseStream
from protocol.tools import McpServerTool, echoed_tools, parse_tools

_TEXT = st.text(min_size=1, max_size=12)
_OPTIONAL = {
    "server_url": st.just("https://mcp.example.org/mcp"),
    "headers": st.dictionaries(_TEXT, _TEXT, max_size=3),
    "authorization": _TEXT,
    "allowed_tools": st.lists(_TEXT, max_size=3),
    "require_approval": st.sampled_from(["always", "never"]),
    "server_description": _TEXT,
    "connector_id": _TEXT,
    "tunnel_id": _TEXT,
    "defer_loading": st.booleans(),
}


@st.composite
def mcp_tools(draw: st.DrawFn) -> dict[str, Any]:
    tool: dict[str, Any] = {"type": "mcp", "server_label": draw(_TEXT)}
    for key, values in _OPTIONAL.items():
        if draw(st.booleans()):
            tool[key] = draw(values)
    return tool


@given(mcp_tools())
def test_secrets_never_reach_the_raw_tool(tool: dict[str, Any]) -> None:
    """MCP-2, MCP-3: a connector or tunnel is a 400 at its field; no ``server_url`` is a 400;
    otherwise the echo is the tool without ``headers`` and ``authorization``, which only the
    typed view keeps (for the calls)."""
    raw = [msgspec.Raw(msgspec.json.encode(tool))]
    try:
        toolset = parse_tools(raw)
    except InvalidRequest as exc:
        if "connector_id" in tool:
            assert (exc.code, exc.param) == ("unsupported_parameter", "tools[0].connector_id")
        elif "tunnel_id" in tool:
            assert (exc.code, exc.param) == ("unsupported_parameter", "tools[0].tunnel_id")
        else:
            assert "server_url" not in tool
            assert (exc.code, exc.param) == ("missing_required_parameter", "tools[0].server_url")
        return
    assert "connector_id" not in tool and "tunnel_id" not in tool
    (echo,) = [msgspec.json.decode(r) for r in echoed_tools(toolset)]
    assert echo == {k: v for k, v in tool.items() if k not in ("headers", "authorization")}
    (spec,) = toolset.mcp
    assert isinstance(spec, McpServerTool)
    assert spec.headers == tool.get("headers") and spec.authorization == tool.get("authorization")


def _stream() -> ResponseStream:
    stream = ResponseStream(Response(id="resp_1", created_at=0, model="m"))
    stream.created()
    stream.in_progress()
    return stream


def test_hosted_items_are_numbered_and_kept() -> None:
    """MCP-5, MCP-7: a hosted item's progress events carry its id and index, numbered in
    order; ORD-8: a response that fails while a call is open keeps it ``incomplete``."""
    stream = _stream()
    listing = McpListTools(id="mcpl_1", server_label="s", tools=[])
    added = stream.open_hosted(listing)
    progress = stream.hosted_event(ev.McpListToolsInProgress)
    done = stream.close_hosted(listing)
    assert [added.sequence_number, progress.sequence_number, done.sequence_number] == [2, 3, 4]
    assert (progress.item_id, progress.output_index) == ("mcpl_1", 0)
    call = McpCall(id="mcp_1", server_label="s", name="t", arguments="", status="in_progress")
    stream.open_hosted(call)
    delta = stream.hosted_event(ev.McpCallArgumentsDelta, delta="{")
    assert isinstance(delta, ev.McpCallArgumentsDelta) and delta.output_index == 1
    stream.failed("server_error", "boom", None, 0)
    kept = stream.output[1]
    assert isinstance(kept, McpCall) and kept.status == "incomplete"


def test_a_hosted_event_needs_its_open_item() -> None:
    stream = _stream()
    with pytest.raises(Exception, match="open hosted item"):
        stream.hosted_event(ev.McpCallCompleted)
