"""Compaction behind upstream backends (COMPACT-5): a Responses upstream compacts itself (its
``/responses/compact``, its blob forwarded back unchanged); a chat upstream's model writes the
summary, which it later reads as a user message."""

from __future__ import annotations

from typing import Any

import aiohttp
from openai import AsyncOpenAI

from tests.support.server import LiveServer
from tests.support.tools import WEATHER
from tests.support.ws import read_until
from tests.upstream.conftest import StartEngine, router_for
from tests.upstream.peer import ChatPeer, Reply, ResponsesPeer

HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "Tell me about Lima."},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Warm."}]},
    {"role": "user", "content": "And Quito?"},
]


async def compact_json(server: LiveServer, **body: Any) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{server.base_url}/responses/compact", json=body) as resp,
    ):
        assert resp.status == 200, await resp.text()
        data: dict[str, Any] = await resp.json()
    return data


async def test_responses_upstream_compacts_itself(
    responses_server: LiveServer, responses_peer: ResponsesPeer
) -> None:
    """COMPACT-5: forwarded to ``/responses/compact``; the upstream's window and usage come
    back, and its blob is sent back unchanged on the next create."""
    sdk = AsyncOpenAI(base_url=responses_server.base_url, api_key="x", max_retries=0)
    compacted = await sdk.responses.compact(model="model-a", input=HISTORY)
    await sdk.close()
    sent = responses_peer.requests[-1]
    assert sent.path == "/v1/responses/compact" and sent.body["model"] == "up-model"
    assert [i.get("role") for i in sent.body["input"]] == ["user", "assistant", "user"]
    assert compacted.usage.input_tokens == 321 and compacted.usage.output_tokens == 45
    output = [o.model_dump(exclude_none=True, warnings=False) for o in compacted.output]
    assert output[-1] == {
        "id": "cmp_up_1",
        "type": "compaction",
        "encrypted_content": "upstream-blob-1",
    }
    async with aiohttp.ClientSession() as http:
        body = {"model": "model-a", "input": [*output, {"role": "user", "content": "Next?"}]}
        async with http.post(f"{responses_server.base_url}/responses", json=body) as resp:
            assert resp.status == 200
    forwarded = responses_peer.last["input"]
    assert {"type": "compaction", "encrypted_content": "upstream-blob-1"} in forwarded


async def test_chat_upstream_summarises_with_its_model(
    chat_server: LiveServer, chat_peer: ChatPeer
) -> None:
    """COMPACT-5: the chat model is asked for a summary of what is replaced; the sealed summary
    reaches it again as a user message when the conversation continues."""
    chat_peer.queue(Reply(text="Lima is warm; Quito was asked next."))
    data = await compact_json(chat_server, model="model-a", input=HISTORY)
    asked = chat_peer.last["messages"]
    assert asked[-2] == {"role": "assistant", "content": "Warm."}
    assert asked[-1]["role"] == "user" and asked[-1]["content"].startswith("Summarise")
    assert [o["type"] for o in data["output"]] == ["message", "compaction", "message"]
    assert data["usage"]["output_tokens"] == 7  # the peer's own count
    follow = [*data["output"], {"role": "user", "content": "Next?"}]
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{chat_server.base_url}/responses", json={"model": "model-a", "input": follow}
        ) as resp,
    ):
        assert resp.status == 200
    messages = chat_peer.last["messages"]
    assert {
        "role": "user",
        "content": "Summary of the earlier conversation:\nLima is warm; Quito was asked next.",
    } in messages
    assert "Warm." not in str(messages)


async def test_chat_upstream_context_management_over_websocket(
    chat_peer: ChatPeer, engine_for: StartEngine
) -> None:
    """COMPACT-3 with a chat upstream: the summary call comes first, then sampling reads it."""
    server = await engine_for(router_for("chat", chat_peer.base_url))
    chat_peer.queue(Reply(text="SUMMARY"), Reply(text="Quito is cool."))
    create = {"type": "response.create", "model": "model-a", "input": HISTORY}
    create["context_management"] = [{"type": "compaction", "compact_threshold": 1}]
    create["tools"] = [WEATHER]
    async with aiohttp.ClientSession() as http, http.ws_connect(server.ws_url) as ws:
        await ws.send_json(create)
        done = (await read_until(ws, "response.completed"))[-1]
    output = done["response"]["output"]
    assert [o["type"] for o in output] == ["compaction", "message"]
    assert output[1]["content"][0]["text"] == "Quito is cool."
    summarise, sample = (r.body for r in chat_peer.requests[-2:])
    assert "tools" not in summarise and sample["tools"]
    assert sample["messages"][-2]["content"].endswith("SUMMARY")
    assert done["response"]["usage"]["input_tokens"] == 11 + 11  # the peer's counts, both calls


async def test_upstream_compaction_refusal_keeps_its_status(
    responses_server: LiveServer, responses_peer: ResponsesPeer
) -> None:
    """COMPACT-5: an upstream's 4xx on ``/responses/compact`` is ``upstream_error`` with that
    status, its message sanitised (no key)."""
    responses_peer.queue(Reply(status=422, error_body={"error": {"message": "too long"}}))
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{responses_server.base_url}/responses/compact",
            json={"model": "model-a", "input": HISTORY},
        ) as resp,
    ):
        body = await resp.json()
    assert resp.status == 422
    assert body["error"]["code"] == "upstream_error"
    assert body["error"]["type"] == "invalid_request_error"
    assert "too long" in body["error"]["message"]
