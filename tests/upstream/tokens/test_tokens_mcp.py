"""A ``tokens`` route whose trajectory holds a remote MCP call and its output token-exact
(SPEC: MCP-15): the model's sampled call, then the server's answer rendered by the chat
template as a tool response, appended, never re-rendered, checked by an independent peer that
samples as a model does (TOK-42) and by a continuation after a restart of the context (the
store)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp

from engine.core import EngineConfig
from engine.store import open_store
from tests.support.mcp import sdk_server
from tests.support.server import start_server
from tests.upstream.token_peer import TokenPeer, tokens_router


async def test_mcp_call_in_the_trajectory(
    token_peer: TokenPeer, tokenizer_dir: Path, tmp_path: Path
) -> None:
    config = EngineConfig(
        tokens_per_second=0,
        default_model="model-a",
        mcp_allow_hosts="127.0.0.1",
        hydration_cache_bytes=0,  # the continuation reads the store
        park_seconds=0,
    )
    store = open_store(f"sqlite:///{tmp_path / 'rollout.db'}")
    live = await start_server(config, tokens_router(token_peer, tokenizer_dir, "sglang"), store)
    call = {"name": "echo", "arguments": {"text": "hi"}}
    token_peer.script.append(f"<tool_call>\n{json.dumps(call)}\n</tool_call>")
    try:
        async with sdk_server() as mcp, aiohttp.ClientSession() as http:
            tool = {
                "type": "mcp",
                "server_label": "calc",
                "server_url": mcp.url,
                "require_approval": "never",
                "allowed_tools": ["echo"],
            }
            body: dict[str, Any] = {
                "model": "model-a",
                "input": "Say hi through the tool.",
                "tools": [tool],
                "include": ["rollout.token_ids"],
            }
            first = await _create(http, live.base_url, body)
            token_peer.script.append("You are welcome.")
            again = {**body, "input": "Thanks.", "previous_response_id": first["id"]}
            second = await _create(http, live.base_url, again)
    finally:
        await live.runner.cleanup()
    assert [i["type"] for i in first["output"]] == ["mcp_list_tools", "mcp_call", "message"]
    assert first["output"][1]["output"] == "echo: hi"
    turn1, turn2, _turn3 = token_peer.turns
    # The tools the model was offered: the listed MCP tool, as a function in its template.
    assert '"name": "echo"' in token_peer.text(turn1.prompt)
    # The second sample's prompt is the first prompt, the sampled call exactly, then only the
    # tool response the template renders for the server's answer.
    head = turn1.prompt + turn1.answer
    assert turn2.prompt[: len(head)] == head
    new = token_peer.text(turn2.prompt[len(head) :])
    assert "<tool_response>\necho: hi\n</tool_response>" in new and "<tool_call>" not in new
    assert first["output"][2]["content"][0]["text"] == "Tool said: echo: hi"
    step1, step2 = first["rollout_tokens"]["samples"]
    assert step1["token_ids"] == turn1.answer and step2["token_ids"] == turn2.answer
    assert step2["prompt_token_ids"] == turn2.prompt[len(head) :]
    assert step1["item_ids"] == [first["output"][1]["id"]]
    # A continuation from the store extends the whole trajectory exactly (no listing again).
    assert token_peer.extends(2) == 1
    assert [i["type"] for i in second["output"]] == ["message"]


async def _create(http: aiohttp.ClientSession, base: str, body: dict[str, Any]) -> Any:
    async with http.post(f"{base}/responses", json=body) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()
