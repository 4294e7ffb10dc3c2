"""Tokens for RL clients (TOK-8, TOK-9): ``include: ["rollout.token_ids"]`` and
``GET /v1/responses/{id}/tokens`` return exactly what the model read and sampled, usage is the
model's own count, the trajectory is owner-checked and survives a restart (SQLite store), and a
continuation after the restart still extends the last prompt exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from engine.core import Engine, EngineConfig
from engine.models.sim.simulator import SimulatedModel
from engine.server.app import create_app
from engine.server.transport.server_config import ServerConfig
from engine.store import open_store
from tests.support.server import LiveServer
from tests.support.tools import WEATHER
from tests.upstream.token_peer import TokenPeer, tokens_router

KEYS = ServerConfig(api_keys=frozenset({"key-alice", "key-bob"}))
ALICE = {"Authorization": "Bearer key-alice"}
BOB = {"Authorization": "Bearer key-bob"}
INCLUDE = ["rollout.token_ids"]


async def start(peer: TokenPeer, tokenizer: Path, db: Path, with_sim: bool = False) -> LiveServer:
    """A server whose store is the SQLite file ``db``; no park, no hydration cache, so every
    continuation reads the store."""
    config = EngineConfig(
        tokens_per_second=0, default_model="model-a", park_seconds=0, hydration_cache_bytes=0
    )
    store = open_store(f"sqlite:///{db}")
    router = tokens_router(peer, tokenizer, "sglang")
    if with_sim:
        router.routes["sim"] = SimulatedModel(0)
    engine = Engine(config, router=router, store=store)
    runner = web.AppRunner(create_app(engine, server=KEYS), handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    assert site._server is not None
    return LiveServer(engine=engine, port=site._server.sockets[0].getsockname()[1], runner=runner)


async def create(http: aiohttp.ClientSession, server: LiveServer, **body: Any) -> dict[str, Any]:
    body = {"model": "model-a", "tools": [WEATHER], "include": INCLUDE, **body}
    async with http.post(f"{server.base_url}/responses", json=body, headers=ALICE) as resp:
        assert resp.status == 200, await resp.text()
        answer: dict[str, Any] = await resp.json()
        return answer


def logprob(n: int) -> float:
    return TokenPeer._logprob(n)


async def test_token_ids_trajectory_and_restart(
    token_peer: TokenPeer, tokenizer_dir: Path, tmp_path: Path
) -> None:
    db = tmp_path / "rollout.db"
    server = await start(token_peer, tokenizer_dir, db)
    async with aiohttp.ClientSession() as http:
        first = await create(http, server, input="Weather?")
        (call,) = [item for item in first["output"] if item["type"] == "function_call"]
        output = {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}
        second = await create(http, server, input=[output], previous_response_id=first["id"])
        turn1, turn2 = token_peer.turns
        # include: each step's exact ids, its prompt's size and the prompt's new part
        (step1,) = first["rollout_tokens"]["samples"]
        assert step1["token_ids"] == turn1.answer
        assert step1["logprobs"] == [logprob(n) for n in range(len(turn1.answer))]
        assert step1["prompt_tokens"] == len(turn1.prompt)
        assert step1["prompt_token_ids"] == turn1.prompt  # the first render is all new
        assert step1["item_ids"] == [call["id"]]
        (step2,) = second["rollout_tokens"]["samples"]
        head = turn1.prompt + turn1.answer
        assert turn2.prompt[: len(head)] == head
        assert step2["prompt_token_ids"] == turn2.prompt[len(head) :]
        assert step2["token_ids"] == turn2.answer
        # usage is the model's own count
        assert second["usage"]["input_tokens"] == len(turn2.prompt)
        assert second["usage"]["output_tokens"] == len(turn2.answer)
        path = f"/responses/{second['id']}/tokens"
        async with http.get(server.base_url + path, headers=ALICE) as resp:
            assert resp.status == 200
            before_restart = await resp.json()
        # another key's response: not found, exactly like a missing one (OWN-2)
        async with http.get(server.base_url + path, headers=BOB) as resp:
            assert resp.status == 404
            assert (await resp.json())["error"]["code"] == "response_not_found"
    await server.runner.cleanup()
    assert before_restart["token_ids"] == turn2.prompt + turn2.answer
    mask = before_restart["sampled"]
    expected = [False] * len(turn1.prompt) + [True] * len(turn1.answer)
    expected += [False] * (len(turn2.prompt) - len(head)) + [True] * len(turn2.answer)
    assert mask == expected
    sampled_lps = [lp for lp, was in zip(before_restart["logprobs"], mask, strict=True) if was]
    assert sampled_lps == step1["logprobs"] + step2["logprobs"]
    assert before_restart["prompt_tokens"] == len(turn2.prompt)

    server = await start(token_peer, tokenizer_dir, db)  # a new process, the same file
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(server.base_url + path, headers=ALICE) as resp:
                assert resp.status == 200
                assert await resp.json() == before_restart
            third = await create(
                http, server, input="And tomorrow?", previous_response_id=second["id"]
            )
            assert third["status"] == "completed"
        turn3 = token_peer.turns[-1]
        head = turn2.prompt + turn2.answer
        assert turn3.prompt[: len(head)] == head  # the trajectory continued from the store
        assert server.engine.counters["create.store_hydrate"] == 1
    finally:
        await server.runner.cleanup()


async def test_a_response_without_trajectory_has_no_tokens(
    token_peer: TokenPeer, tokenizer_dir: Path, tmp_path: Path
) -> None:
    """A stored response of another backend (the simulator) answers 404
    ``response_tokens_not_found``; a create without the include carries no ``rollout_tokens``."""
    server = await start(token_peer, tokenizer_dir, tmp_path / "db", with_sim=True)
    try:
        async with aiohttp.ClientSession() as http:
            plain = await create(http, server, input="Weather?", include=[])
            assert "rollout_tokens" not in plain
            simulated = await create(http, server, model="sim", input="hi")
            url = f"{server.base_url}/responses/{simulated['id']}/tokens"
            async with http.get(url, headers=ALICE) as resp:
                assert resp.status == 404
                assert (await resp.json())["error"]["code"] == "response_tokens_not_found"
    finally:
        await server.runner.cleanup()
