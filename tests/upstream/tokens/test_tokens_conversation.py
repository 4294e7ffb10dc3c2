"""A ``tokens`` route continues a conversation token-exact (CONV-6, TOK-8): every create on the
conversation sends the model the previous prompt and its sampled answer unchanged, then only
the new tokens, whether the context comes from the hydration cache, the WebSocket fast path,
the store after a restart, or the store plus items added through the items API; and
``GET /v1/responses/{id}/tokens`` of the last response is the whole trajectory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from engine.core import Engine, EngineConfig
from engine.server.app import create_app
from engine.store import open_store
from tests.support.server import LiveServer
from tests.support.tools import WEATHER
from tests.upstream.token_peer import TokenPeer, tokens_router


async def _start(peer: TokenPeer, tokenizer: Path, db: Path) -> LiveServer:
    config = EngineConfig(tokens_per_second=0, default_model="model-a")
    engine = Engine(
        config, router=tokens_router(peer, tokenizer, "sglang"), store=open_store(f"sqlite:///{db}")
    )
    runner = web.AppRunner(create_app(engine), handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    assert site._server is not None
    return LiveServer(engine=engine, port=site._server.sockets[0].getsockname()[1], runner=runner)


async def _create(http: aiohttp.ClientSession, server: LiveServer, **body: Any) -> dict[str, Any]:
    body = {"model": "model-a", "tools": [WEATHER], **body}
    async with http.post(f"{server.base_url}/responses", json=body) as resp:
        assert resp.status == 200, await resp.text()
        answer: dict[str, Any] = await resp.json()
        return answer


def _answer_call(response: dict[str, Any]) -> list[dict[str, Any]]:
    (call,) = [item for item in response["output"] if item["type"] == "function_call"]
    return [{"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}]


def _extends(peer: TokenPeer) -> None:
    """Each turn's prompt starts with the previous turn's prompt and answer, exactly."""
    for before, after in zip(peer.turns, peer.turns[1:], strict=False):
        head = before.prompt + before.answer
        assert after.prompt[: len(head)] == head


async def test_a_conversation_continues_token_exact(
    token_peer: TokenPeer, tokenizer_dir: Path, tmp_path: Path
) -> None:
    db = tmp_path / "rollout.db"
    server = await _start(token_peer, tokenizer_dir, db)
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{server.base_url}/conversations", json={}) as resp:
                conv = (await resp.json())["id"]
            first = await _create(http, server, input="Weather?", conversation=conv)
            second = await _create(http, server, input=_answer_call(first), conversation=conv)
            # the first create's suspended rollout, parked at its end (PARK-4), not the items
            assert server.engine.counters["create.unparked"] == 1
            last: dict[str, Any] = second
            async with http.ws_connect(server.ws_url) as ws:  # a new socket: the cache again
                for text in ("Weather in Oslo?", None):
                    payload: dict[str, Any] = {"model": "model-a", "tools": [WEATHER]}
                    payload["conversation"] = conv
                    payload["input"] = text if text is not None else _answer_call(last)
                    await ws.send_str(json.dumps({"type": "response.create", **payload}))
                    while (event := json.loads((await ws.receive(timeout=30)).data))["type"] != (
                        "response.completed"
                    ):
                        assert event["type"] != "error", event
                    last = event["response"]
            # the unparked HTTP continuation and the socket's second create (COMPAT-2)
            assert server.engine.counters["create.fast_path"] == 2
    finally:
        await server.runner.cleanup()
    _extends(token_peer)
    server = await _start(token_peer, tokenizer_dir, db)  # a new process: the store path
    try:
        async with aiohttp.ClientSession() as http:
            third = await _create(http, server, input="And tomorrow?", conversation=conv)
            assert server.engine.counters["create.store_hydrate"] == 1
            # The call's output and a note, through the items API: new to the context
            added = {"items": [*_answer_call(third), {"role": "user", "content": "In Bergen."}]}
            url = f"{server.base_url}/conversations/{conv}/items"
            async with http.post(url, json=added) as resp:
                assert resp.status == 200, await resp.text()
            last = await _create(http, server, input="Weather now?", conversation=conv)
            async with http.get(f"{server.base_url}/responses/{last['id']}/tokens") as resp:
                trajectory = await resp.json()
    finally:
        await server.runner.cleanup()
    _extends(token_peer)
    assert len(token_peer.turns) == 6
    final = token_peer.turns[-1]
    assert trajectory["token_ids"] == final.prompt + final.answer
    assert second["conversation"] == {"id": conv}
