"""Every ending keeps its trajectory (TOK-43): a turn cut by ``max_output_tokens`` is stored
and served by ``GET /v1/responses/{id}/tokens`` with its finish reason, and a chain continued
after it stays exact through the store, on another node sharing the store (a real
``redis-server``) and after a restart; a cancelled answer and one whose model server failed
midway keep what was sampled (``cancelled``, ``error``) and the next turn renders afresh."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI

from engine.core import Engine, EngineConfig
from engine.server.app import create_app
from engine.store import open_store
from tests.store._procs import RedisServer
from tests.support.server import LiveServer, serve_app
from tests.support.tools import WEATHER
from tests.support.wait import wait_for
from tests.upstream.token_peer import TokenPeer, tokens_router


@pytest.fixture
async def redis_url(tmp_path: Path) -> AsyncIterator[str]:
    workdir = tmp_path / "redis"
    workdir.mkdir()
    server = RedisServer(workdir)
    await server.start()
    try:
        yield server.url
    finally:
        await server.kill()


async def start(peer: TokenPeer, tokenizer: Path, store: str, api: str = "sglang") -> LiveServer:
    """A node on ``store`` with no park and no hydration cache: a continuation it did not
    serve itself comes from the store alone."""
    config = EngineConfig(
        tokens_per_second=0, default_model="model-a", park_seconds=0, hydration_cache_bytes=0
    )
    engine = Engine(config, router=tokens_router(peer, tokenizer, api), store=open_store(store))
    runner, port = await serve_app(create_app(engine))
    return LiveServer(engine=engine, port=port, runner=runner)


async def create(http: aiohttp.ClientSession, server: LiveServer, **body: Any) -> dict[str, Any]:
    body = {"model": "model-a", "tools": [WEATHER], **body}
    async with http.post(f"{server.base_url}/responses", json=body) as resp:
        assert resp.status == 200, await resp.text()
        answer: dict[str, Any] = await resp.json()
        return answer


async def tokens(http: aiohttp.ClientSession, server: LiveServer, rid: str) -> dict[str, Any]:
    async with http.get(f"{server.base_url}/responses/{rid}/tokens") as resp:
        assert resp.status == 200, await resp.text()
        body: dict[str, Any] = await resp.json()
        return body


def reasons(trajectory: dict[str, Any]) -> list[str]:
    return [sample["finish_reason"] for sample in trajectory["samples"]]


def extends(peer: TokenPeer, later: int, earlier: int) -> bool:
    head = peer.turns[earlier].prompt + peer.turns[earlier].answer
    return peer.turns[later].prompt[: len(head)] == head


ANSWER = "Sunny all week, with a light breeze."


async def test_a_truncated_turn_is_kept_across_nodes_and_a_restart(
    token_peer: TokenPeer, tokenizer_dir: Path, redis_url: str
) -> None:
    node_a = await start(token_peer, tokenizer_dir, redis_url)
    node_b = await start(token_peer, tokenizer_dir, redis_url)
    try:
        async with aiohttp.ClientSession() as http:
            cut = await create(http, node_a, input="Weather?", max_output_tokens=5)
            assert cut["status"] == "incomplete", cut
            assert cut["incomplete_details"]["reason"] == "max_output_tokens"
            first = token_peer.turns[0]
            assert len(first.answer) == 5 and first.cut
            stored = await tokens(http, node_b, cut["id"])  # served by the other node
            assert stored["token_ids"] == first.prompt + first.answer
            end = len(stored["token_ids"])
            run = {"start": len(first.prompt), "end": end, "finish_reason": "length"}
            assert stored["samples"] == [run]
            called = await create(http, node_b, input="go on", previous_response_id=cut["id"])
            assert extends(token_peer, 1, 0)  # continued on node B from the store, exactly
            assert node_b.engine.counters["create.store_hydrate"] == 1
        await node_a.runner.cleanup()
        node_a = await start(token_peer, tokenizer_dir, redis_url)  # a restart
        async with aiohttp.ClientSession() as http:
            (call,) = [item for item in called["output"] if item["type"] == "function_call"]
            output = {"type": "function_call_output", "call_id": call["call_id"], "output": "sun"}
            done = await create(http, node_a, input=[output], previous_response_id=called["id"])
            assert done["status"] == "completed"
            assert extends(token_peer, 2, 1)
            whole = await tokens(http, node_a, done["id"])
        last = token_peer.turns[2]
        assert whole["token_ids"] == last.prompt + last.answer
        assert reasons(whole) == ["length", "tool", "stop"]
        sampled = [n for n, was in enumerate(whole["sampled"]) if was]
        runs = [n for s in whole["samples"] for n in range(s["start"], s["end"])]
        assert sampled == runs  # the boundaries tile the sampled mask
    finally:
        await node_a.runner.cleanup()
        await node_b.runner.cleanup()


async def test_cancelled_and_failed_answers_keep_what_was_sampled(
    token_peer: TokenPeer, tokenizer_dir: Path
) -> None:
    server = await start(token_peer, tokenizer_dir, "memory://", api="vllm")
    client = AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    try:
        async with aiohttp.ClientSession() as http:
            token_peer.resume.clear()  # the answer stops after its first chunk
            token_peer.script.extend([ANSWER, ANSWER])
            running = await client.responses.create(
                model="model-a", input="Weather?", tools=[WEATHER], background=True
            )
            await wait_for(token_peer.paused.is_set, "the peer mid-answer")
            cancelled = await client.responses.cancel(running.id)
            assert cancelled.status == "cancelled"
            token_peer.resume.set()
            first = token_peer.turns[0]

            async def stored() -> dict[str, Any] | None:
                async with http.get(f"{server.base_url}/responses/{running.id}/tokens") as resp:
                    return await resp.json() if resp.status == 200 else None

            kept: Any = await wait_for(stored, "the cancelled response's record")
            assert reasons(kept) == ["cancelled"]
            assert kept["token_ids"] == first.prompt + first.answer[:3]  # the first chunk

            token_peer.fail_midway = True
            events = await client.responses.create(
                model="model-a", input="Again?", tools=[WEATHER], stream=True
            )
            failed = [e async for e in events][-1].response
            assert failed.status == "failed" and failed.output[0].content[0].text
            second = token_peer.turns[1]
            broken = await tokens(http, server, failed.id)
            assert reasons(broken) == ["error"]
            assert broken["token_ids"] == second.prompt + second.answer[:3]

            token_peer.fail_midway = False
            after = await create(http, server, input="Once more?", previous_response_id=failed.id)
            assert after["status"] == "completed"
            assert not extends(token_peer, 2, 1)  # a cut answer: rendered afresh (TOK-4)
            fresh = await tokens(http, server, after["id"])
            assert fresh["token_ids"] == token_peer.turns[2].prompt + token_peer.turns[2].answer
            assert reasons(fresh) == ["tool"]
            assert token_peer.paused.is_set() and not token_peer.script
    finally:
        token_peer.resume.set()
        await client.close()
        await server.runner.cleanup()
