"""The compat fast path with the official SDK over WebSocket (COMPAT-2, ROLL-2, POST-1).

Standard clients send ``previous_response_id`` + only the new tool outputs. On one socket every
such continuation must resume the same suspended coroutine: pre-inference over the history ran
once, each continuation rendered only its new items, post-inference ran once at the end.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from openai import AsyncOpenAI

from engine.conversation.render import render_item
from engine.models.sim.scenarios import CODING_AGENT_STEPS
from protocol.codec import parse_input
from tests.support.server import LiveServer

TOOLS: list[Any] = [
    {"type": "function", "name": name, "parameters": {"type": "object", "properties": {}}}
    for name in ("list_dir", "read_file", "search", "edit_file", "run_tests")
]


async def _run_turn(conn: Any) -> Any:
    async for event in conn:
        if event.type == "response.completed":
            return event.response
        assert event.type != "error", event


async def test_compat_continuations_resume_one_coroutine(server: LiveServer) -> None:
    client = AsyncOpenAI(base_url=server.base_url, api_key="x")
    response_ids: list[str] = []
    rendered: list[int] = []
    async with client.responses.connect() as conn:
        await conn.response.create(
            model="sim-coding-agent", input="Fix the tests.", tools=TOOLS, store=False
        )
        response = await _run_turn(conn)
        while response.output[-1].type == "function_call":
            response_ids.append(response.id)
            call = response.output[-1]
            output = {
                "type": "function_call_output",
                "call_id": call.call_id,
                "output": "ok\n" * 900,
            }
            rendered.append(len(render_item(parse_input([output])[0])))
            await conn.response.create(
                model="sim-coding-agent",
                previous_response_id=response.id,
                input=[output],
                tools=TOOLS,
                store=False,
            )
            response = await _run_turn(conn)
        response_ids.append(response.id)
    await client.close()

    assert len(response_ids) == len(CODING_AGENT_STEPS) + 1  # one response per turn
    assert server.engine.counters["create.fast_path"] == len(CODING_AGENT_STEPS)
    assert server.engine.counters["create.stateless"] == 1
    await server.engine.post.stop()
    records = list(server.engine.post.recent)
    # post-inference once per response, each record billing exactly its response (POST-1)
    assert [r.response_ids for r in records] == [[rid] for rid in response_ids]
    assert len({r.rollout_id for r in records}) == 1  # ... all served by one coroutine
    runs: Counter[str] = Counter()
    for record in records:
        runs.update(record.stage_runs)
    assert runs["validate.full"] == 1  # the history was processed once
    assert runs["validate.incremental"] == len(CODING_AGENT_STEPS)  # then only new items
    assert runs["header.render"] == 1  # unchanged tools: header reused
    # each continuation rendered only its items, and each record carries its own offer only
    # (POST-3: a record is O(1) in the rollout's length, the ledger O(n))
    assert [t for r in records for t in r.resume_tokens] == rendered
    assert [len(r.resume_tokens) for r in records] == [0] + [1] * len(CODING_AGENT_STEPS)
    assert [r.stage_runs.get("validate.incremental", 0) for r in records[1:]] == [1] * len(
        CODING_AGENT_STEPS
    )


async def test_http_stateless_resend_processes_only_the_new_items(server: LiveServer) -> None:
    """COMPAT-5, COMPAT-7: nothing named, the whole history resent: the first create runs the
    full pipeline, each resend continues the context of the response it repeats and runs
    pre-inference over its new items only."""
    client = AsyncOpenAI(base_url=server.base_url, api_key="x")
    history: list[Any] = [{"role": "user", "content": "Fix the tests."}]
    for _ in range(3):
        response = await client.responses.create(
            model="sim-coding-agent", input=history, tools=TOOLS, store=False
        )
        call = response.output[-1]
        history += [
            call.model_dump(exclude_none=True),
            {"type": "function_call_output", "call_id": call.call_id, "output": "ok"},
        ]
    await client.close()
    await server.engine.post.stop()
    records = list(server.engine.post.recent)
    assert len(records) == 3
    assert records[0].stage_runs["validate.full"] == 1
    for record in records[1:]:
        assert "validate.full" not in record.stage_runs
        assert record.stage_runs["validate.incremental"] == 1
        assert record.stage_tokens.get("full", 0) == 0  # no history rendered again
    assert server.engine.counters["create.stateless"] == 3
    assert server.engine.counters["create.resent"] == 2
