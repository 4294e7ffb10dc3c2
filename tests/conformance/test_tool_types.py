"""Every tool type and every input item type the openai SDK allows (TOOL-1..TOOL-5, ITEM-7..ITEM-9).

The samples (``tests/conformance/samples.py``) are checked against the SDK's own unions first, so
the tests below cover exactly what the installed SDK lets a client send.
"""

from __future__ import annotations

import json
import typing
from typing import Any

import aiohttp
import pydantic
import pytest
from openai.types.responses import ToolChoiceTypes
from openai.types.responses.response_input_item import ResponseInputItem
from openai.types.responses.tool import Tool

from engine.conversation.pipeline import redact_item
from engine.conversation.render import item_text
from protocol.codec import parse_input
from protocol.items import OpaqueItem
from tests.conformance.samples import (
    ALL_TOOLS,
    CUSTOM,
    ECHOED_TOOLS,
    FUNCTION,
    HOSTED_CHOICES,
    HOSTED_TOOLS,
    INPUT_ITEMS,
    NAMESPACE,
    echoed,
)
from tests.support.server import LiveServer

TERMINAL = {"response.completed", "response.failed", "response.incomplete"}


def union_tags(union: Any) -> set[str]:
    """The ``type`` literals of every member of an SDK union."""
    args = typing.get_args(union)
    members = typing.get_args(args[0]) if typing.get_origin(args[0]) is typing.Union else args
    return {tag for member in members for tag in _literals(member.model_fields["type"].annotation)}


def _literals(annotation: Any) -> set[str]:
    """String literals anywhere in an annotation (``Optional[Literal["x"]]`` gives {"x"})."""
    found = {a for a in typing.get_args(annotation) if isinstance(a, str)}
    for inner in typing.get_args(annotation):
        if not isinstance(inner, str):
            found |= _literals(inner)
    return found


def test_samples_cover_the_sdk_unions() -> None:
    """The samples are SDK-valid and cover every member of ``Tool`` and ``ResponseInputItem``."""
    tools: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(Tool)
    for tool in ALL_TOOLS:
        tools.validate_python(tool)
    assert {t["type"] for t in ALL_TOOLS} == union_tags(Tool)
    items: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ResponseInputItem)
    for item in INPUT_ITEMS:
        items.validate_python(item)
    assert {i.get("type", "message") for i in INPUT_ITEMS} == union_tags(ResponseInputItem)
    forced = {c["type"] for c in HOSTED_CHOICES}
    assert forced >= set(typing.get_args(ToolChoiceTypes.model_fields["type"].annotation))


async def post(server: LiveServer, body: dict[str, Any]) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{server.base_url}/responses", json={"model": "sim", **body}) as resp,
    ):
        return resp.status, await resp.text()


async def ws_turn(ws: aiohttp.ClientWebSocketResponse, frame: str) -> list[str]:
    """Send one create (raw text); the raw frames up to its terminal event or error."""
    await ws.send_str(frame)
    frames: list[str] = []
    while True:
        frames.append(await ws.receive_str(timeout=10))
        kind = json.loads(frames[-1])["type"]
        if kind in TERMINAL or kind == "error":
            return frames


async def test_every_tool_type_is_accepted_and_echoed_exactly(server: LiveServer) -> None:
    """TOOL-1: all 16 SDK tool types in one create; the Response echoes each tool byte for byte
    (key order and spacing as sent), over WebSocket and HTTP."""
    tools_text = "[" + ", ".join(json.dumps(t, indent=1) for t in ALL_TOOLS) + "]"
    frame = f'{{"type": "response.create", "model": "sim", "input": "hi", "tools": {tools_text}}}'
    async with aiohttp.ClientSession() as http, http.ws_connect(server.ws_url) as ws:
        frames = await ws_turn(ws, frame)
    terminal = json.loads(frames[-1])
    assert terminal["type"] == "response.completed"
    assert terminal["response"]["tools"] == ECHOED_TOOLS
    for tool in ALL_TOOLS:
        if echoed(tool) == tool:  # not completed for CONF-3: the bytes the client sent
            assert json.dumps(tool, indent=1) in frames[-1]
    status, text = await post(server, {"input": "hi", "tools": ALL_TOOLS})
    assert status == 200, text
    assert json.loads(text)["tools"] == ECHOED_TOOLS


async def test_hosted_tools_are_never_called_by_the_simulator(server: LiveServer) -> None:
    """TOOL-4: with only hosted tools the simulator answers in text; with a function too, it
    calls the function. The ``mcp`` sample is the engine's to list (MCP-4): its private address
    is refused (MCP-11), so its listing fails and offers nothing."""
    status, text = await post(server, {"input": "Search the web", "tools": HOSTED_TOOLS})
    assert status == 200, text
    assert [i["type"] for i in json.loads(text)["output"]] == ["mcp_list_tools", "message"]
    status, text = await post(server, {"input": "Paris", "tools": [*HOSTED_TOOLS, FUNCTION]})
    listing, call = json.loads(text)["output"]
    assert listing["type"] == "mcp_list_tools" and "mcp-allow-hosts" in listing["error"]
    assert call["type"] == "function_call" and call["name"] == "get_weather"


@pytest.mark.parametrize("choice", HOSTED_CHOICES, ids=lambda c: c["type"])
async def test_forcing_a_hosted_tool_on_the_simulator_is_a_clear_400(
    server: LiveServer, choice: dict[str, Any]
) -> None:
    """TOOL-5: the simulator cannot run hosted tools; forcing one is rejected before any event,
    over HTTP and WebSocket, and the socket stays usable."""
    body = {"input": "hi", "tools": HOSTED_TOOLS, "tool_choice": choice}
    status, text = await post(server, body)
    assert status == 400
    error = json.loads(text)["error"]
    assert (error["code"], error["param"]) == ("unsupported_tool_choice", "tool_choice.type")
    async with aiohttp.ClientSession() as http, http.ws_connect(server.ws_url) as ws:
        frame = json.dumps({"type": "response.create", "model": "sim", **body})
        (only,) = await ws_turn(ws, frame)
        assert json.loads(only)["error"]["code"] == "unsupported_tool_choice"
        again = await ws_turn(ws, json.dumps({"type": "response.create", "input": "ok"}))
        assert json.loads(again[-1])["type"] == "response.completed"


async def test_tool_choice_forms_of_the_sdk_are_accepted(server: LiveServer) -> None:
    """TOOL-5: ``custom`` forces that custom tool; ``allowed_tools`` restricts the choice."""
    tools = [FUNCTION, CUSTOM, NAMESPACE]
    forced = {"type": "custom", "name": "apply_patch"}
    status, text = await post(server, {"input": "x", "tools": tools, "tool_choice": forced})
    body = json.loads(text)
    assert status == 200 and body["tool_choice"] == forced
    assert [(i["type"], i["name"]) for i in body["output"]] == [("custom_tool_call", "apply_patch")]
    only = [{"type": "function", "name": "lookup"}]
    allowed = {"type": "allowed_tools", "mode": "required", "tools": only}
    status, text = await post(server, {"input": "x", "tools": tools, "tool_choice": allowed})
    (call,) = json.loads(text)["output"]
    assert (call["name"], call["namespace"]) == ("lookup", "docs")


async def test_namespaced_custom_tool_and_outputs_over_http(server: LiveServer) -> None:
    """TOOL-2, TOOL-3: a custom tool inside a namespace is called with ``namespace``; its output
    (a ``custom_tool_call_output``) is matched by ``call_id`` on a stateless continuation."""
    status, text = await post(server, {"input": "grep_docs please", "tools": [NAMESPACE]})
    (call,) = json.loads(text)["output"]
    assert call["type"] == "custom_tool_call" and call["namespace"] == "docs"
    replay = {k: v for k, v in call.items() if k != "status"}
    output = {"type": "custom_tool_call_output", "call_id": call["call_id"], "output": "3 hits"}
    history = [{"role": "user", "content": "grep_docs please"}, replay, output]
    status, text = await post(server, {"input": history, "tools": [NAMESPACE]})
    assert status == 200, text
    assert (
        json.loads(text)["output"][0]["content"][0]["text"] == "Based on the tool results: 3 hits"
    )
    missing = [{"role": "user", "content": "grep_docs please"}, replay]
    status, text = await post(server, {"input": missing, "tools": [NAMESPACE]})
    assert status == 400 and json.loads(text)["error"]["code"] == "tool_output_missing"


async def test_every_input_item_type_decodes_and_is_kept(server: LiveServer) -> None:
    """ITEM-7, ITEM-8, ITEM-9: one of each SDK input item in one stored request; the response
    completes, and ``input_items`` lists them as sent (opaque items exactly, reasoning and
    compaction ``encrypted_content`` intact). A ``compaction_trigger`` must be the last item and
    is consumed, never kept (COMPACT-7): it is sent in its own test."""
    items = [i for i in INPUT_ITEMS if i.get("type") != "compaction_trigger"]
    status, text = await post(server, {"input": items, "store": True})
    assert status == 200, text
    response = json.loads(text)
    assert response["status"] == "completed"
    async with (
        aiohttp.ClientSession() as http,
        http.get(
            f"{server.base_url}/responses/{response['id']}/input_items?order=asc&limit=100"
        ) as resp,
    ):
        listed = (await resp.json())["data"]
    assert len(listed) == len(items)
    for sent, kept in zip(items, listed, strict=True):
        if sent.get("type") in ("message", None, "item_reference", "function_call"):
            continue  # listed in their normalised form (STORE-3)
        if sent["type"] in ("function_call_output", "custom_tool_call", "custom_tool_call_output"):
            kept = {k: v for k, v in kept.items() if k not in ("id", "status")}
        if sent["type"] == "compaction" and "id" not in sent:  # listed with an id (STORE-3)
            assert kept.pop("id").startswith("cmp_")
        assert kept == sent


@pytest.mark.parametrize("sample", INPUT_ITEMS, ids=lambda i: i.get("type", "easy_message"))
def test_every_input_item_is_rendered_for_the_model(sample: dict[str, Any]) -> None:
    """ITEM-7: no item is dropped silently: each renders to text the model reads, carrying its
    content."""
    if sample.get("type") == "item_reference":
        return  # replaced by the item it names before rendering (ITEM-4)
    (item,) = parse_input([sample])
    text = item_text(item)
    assert text.strip()
    for value in _leaf_strings(sample):
        if value not in ("developer", "user", "assistant", "completed") and len(value) > 2:
            assert value in text or sample.get("type") == "compaction", (value, text)


def _leaf_strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        # Identifiers and labels; the content is what the model must see.
        keys = ("type", "id", "call_id", "status", "role", "encrypted_content")
        return [s for k, v in value.items() if k not in keys for s in _leaf_strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _leaf_strings(v)]
    return []


SECRET = "AKIA" + "ABCDEFGHIJKLMNOP"  # an AWS access key id shape (SAFE-1)


async def test_secrets_in_opaque_and_custom_items_are_found_and_redacted(
    server: LiveServer,
) -> None:
    """PIPE-2, SAFE-3, ITEM-7: the scan reads opaque items and custom tool inputs; the redact
    policy masks every string of them the model reads, but not `type` and `id`."""
    shell = {"type": "shell_call", "call_id": "sh_1", "action": {"commands": [f"echo {SECRET}"]}}
    custom = {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": SECRET}
    answer = {"type": "custom_tool_call_output", "call_id": "c1", "output": "ok"}
    status, text = await post(server, {"input": [shell, custom, answer]})
    assert status == 200, text
    findings = json.loads(text)["safety"]["findings"]
    assert [(f["kind"], f["item_index"]) for f in findings] == [
        ("aws_access_key_id", 0),
        ("aws_access_key_id", 1),
    ]
    (opaque, call, _) = parse_input([shell, custom, answer])
    masked = redact_item(opaque)
    assert SECRET not in item_text(masked) and "[REDACTED:aws_access_key_id]" in item_text(masked)
    assert isinstance(masked, OpaqueItem) and masked.type == "shell_call"
    assert SECRET not in item_text(redact_item(call))
