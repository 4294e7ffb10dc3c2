"""The server's own per-turn stage timings for the benchmark (OBS-5), on a real server."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiohttp

from engine.core import EngineConfig
from tests.support.server import LiveServer
from tests.support.tools import READ_FILE
from tests.support.ws import turn


async def _turn(ws: aiohttp.ClientWebSocketResponse, event: dict[str, Any]) -> dict[str, Any]:
    done = (await turn(ws, event))[-1]
    assert done["type"] == "response.completed", done
    return dict(done["response"])


async def _two_turns(live: LiveServer) -> list[dict[str, Any]]:
    create = {"type": "response.create", "model": "sim", "input": "read_file a.py",
              "tools": [READ_FILE], "instructions": "Be brief.", "store": False}  # fmt: skip
    async with aiohttp.ClientSession() as session, session.ws_connect(live.ws_url) as ws:
        first = await _turn(ws, create)
        call = first["output"][-1]
        output = {"type": "function_call_output", "call_id": call["call_id"], "output": "x = 1"}
        follow = {**create, "input": [output], "previous_response_id": first["id"]}
        return [first, await _turn(ws, follow)]


async def test_each_turn_gets_a_record_with_stages_and_token_counts(
    server_factory: Callable[..., Any],
) -> None:
    live: LiveServer = await server_factory(EngineConfig(tokens_per_second=0, bench_timings=True))
    responses = await _two_turns(live)
    await live.engine.post.stop()  # every ledger record accounted: the post stage is filled
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{live.base_url}/bench/timings") as resp:
            records = (await resp.json())["data"]
        async with session.get(f"{live.base_url}/bench/timings") as resp:
            assert (await resp.json())["data"] == []  # handed over once
    assert [r["response_id"] for r in records] == [r["id"] for r in responses]
    first, second = records
    for record in records:
        stages = record["stages"]
        assert stages["send"] > 0 and stages["decode"] > 0 and stages["post"] > 0
        assert stages["pre_inference"] >= stages["render"] > 0
        # measured, not a default: the rollout woke before the model started (OBS-5)
        assert stages["dispatch"] > 0
    # The server's own counts: the continuation's prompt is the first one plus the new items.
    assert first["prompt_tokens"] == responses[0]["usage"]["input_tokens"]
    assert second["prompt_tokens"] == responses[1]["usage"]["input_tokens"]
    assert 0 < second["rendered_tokens"] < second["prompt_tokens"]
    assert first["rendered_tokens"] == first["prompt_tokens"]  # everything was new
    # What the rollout holds after the turn: the prompt plus the model's own output.
    assert first["prompt_tokens"] < first["context_tokens"] < second["prompt_tokens"]


async def test_without_the_switch_there_is_no_endpoint_and_no_clock(server: LiveServer) -> None:
    assert server.engine.bench_clock is None
    await _two_turns(server)
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{server.base_url}/bench/timings") as resp,
    ):
        assert resp.status == 404
