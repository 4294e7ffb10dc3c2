"""``response.inject``, OpenAI's multi-agent beta verb, with the openai SDK's beta WebSocket
connection (INJECT-1..INJECT-9): ``client.beta.responses.connect()`` sends it with
``conn.response.inject(...)`` and every frame is parsed with the SDK's own beta server-event union
(``BetaResponsesServerEvent``), so the answers are the SDK's ``BetaResponseInjectCreatedEvent`` /
``BetaResponseInjectFailedEvent``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pydantic
import pytest
from openai import AsyncOpenAI
from openai.types.beta import BetaResponse, BetaResponsesServerEvent

from engine.core import EngineConfig
from tests.support.server import LiveServer
from tests.support.tools import WEATHER

BETA = {"OpenAI-Beta": "responses_multi_agent=v1"}
TIME = {**WEATHER, "name": "get_time"}
ASK = "Use get_weather and get_time for Tokyo"
TERMINAL = {"response.completed", "response.failed", "response.incomplete"}
EVENTS: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(BetaResponsesServerEvent)


def output(call_id: str, text: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": text}


Connect = Callable[..., Any]


@pytest.fixture
async def connect(server_factory: Callable[..., Any]) -> AsyncIterator[Connect]:
    """``make(headers)``: a server and the SDK's beta WebSocket connection to it."""
    stack: list[Any] = []

    async def make(headers: dict[str, str] | None = None, tps: float = 0) -> Any:
        live: LiveServer = await server_factory(EngineConfig(tokens_per_second=tps))
        client = AsyncOpenAI(base_url=live.base_url, api_key="x", max_retries=0)
        manager = client.beta.responses.connect(extra_headers=headers or {})
        stack.append((client, manager))
        return await manager.__aenter__()

    try:
        yield make
    finally:
        for client, manager in reversed(stack):
            await manager.__aexit__(None, None, None)
            await client.close()


def text(response: Any) -> str:
    """The answer's text (the beta Response model has no ``output_text`` helper)."""
    return "".join(p.text for i in response.output if i.type == "message" for p in i.content)


@dataclass
class Done:
    """Append mode's `response.done` (APPEND-2, our extension): its snapshot is the SDK's."""

    response: BetaResponse
    type: str = "response.done"


async def recv(conn: Any) -> Any:
    """One frame, parsed strictly with the SDK's beta server-event union."""
    data = json.loads(await asyncio.wait_for(conn.recv_bytes(), 10))
    if data["type"] == "response.done":
        return Done(BetaResponse.model_validate(data["response"]))
    return EVENTS.validate_python(data)


async def until(conn: Any, *kinds: str) -> list[Any]:
    events: list[Any] = []
    while not events or events[-1].type not in kinds:
        events.append(await recv(conn))
    return events


async def suspended(conn: Any) -> tuple[str, list[Any]]:
    """A create whose response stops at two parallel calls; returns its id and calls."""
    await conn.response.create(model="sim", input=ASK, tools=[WEATHER, TIME], store=False)
    events = await until(conn, "response.completed", "response.done")
    response = events[-1].response
    return response.id, [i for i in response.output if i.type == "function_call"]


async def test_standard_mode_inject_continues_in_a_successor(connect: Connect) -> None:
    """INJECT-1, INJECT-2, INJECT-4, INJECT-5: with the beta header, a completed standard-mode
    response that waits for its calls takes their outputs by inject: a partial inject is held
    and acknowledged (`inject.created`, the target's next sequence number); the last one is
    acknowledged and a successor response (`previous_response_id` = the target, the target's
    settings, the outputs as its input) answers from both outputs."""
    conn = await connect(BETA)
    target, calls = await suspended(conn)
    assert [c.name for c in calls] == ["get_weather", "get_time"]
    await conn.response.inject(response_id=target, input=[output(calls[0].call_id, "rain")])
    first = await recv(conn)
    assert first.type == "response.inject.created" and first.response_id == target
    await conn.response.inject(response_id=target, input=[output(calls[1].call_id, "noon")])
    events = await until(conn, *TERMINAL)
    assert events[0].type == "response.inject.created"
    assert events[0].sequence_number == first.sequence_number + 1
    successor = events[-1].response
    assert events[1].type == "response.created" and successor.id != target
    assert successor.previous_response_id == target
    assert {t.name for t in successor.tools} == {"get_weather", "get_time"}
    assert text(successor) == "Based on the tool results: rain; noon"


async def test_append_mode_inject_resumes_the_same_response(connect: Connect) -> None:
    """INJECT-3, APPEND-4: an append-mode response (here the connection's default, APPEND-1)
    takes the same verb without the multi-agent beta: acknowledged, then the same response
    resumes and completes."""
    conn = await connect({"OpenAI-Beta": "rollout-append=v1"})
    target, calls = await suspended(conn)
    both = [output(calls[0].call_id, "rain"), output(calls[1].call_id, "noon")]
    await conn.response.inject(response_id=target, input=both)
    events = await until(conn, *TERMINAL)
    assert events[0].type == "response.inject.created" and events[0].response_id == target
    assert events[-1].response.id == target
    assert text(events[-1].response) == "Based on the tool results: rain; noon"


async def test_inject_failures(connect: Connect) -> None:
    """INJECT-6, INJECT-8: a target that takes no input is `inject.failed` with the input
    returned (sequence 0, no lane); an input error (a second output for an answered call) is an
    `error` event and leaves the target waiting, so the right inject still continues it."""
    conn = await connect(BETA)
    unknown = [output("call_x", "y")]
    await conn.response.inject(response_id="resp_nope", input=unknown)
    failed = await recv(conn)
    assert failed.type == "response.inject.failed" and failed.sequence_number == 0
    assert failed.error.code == "response_not_found"
    assert [i.call_id for i in failed.input] == ["call_x"]
    target, calls = await suspended(conn)
    await conn.response.inject(response_id=target, input=[output(calls[0].call_id, "rain")])
    assert (await recv(conn)).type == "response.inject.created"
    await conn.response.inject(response_id=target, input=[output(calls[0].call_id, "again")])
    error = await recv(conn)
    assert error.type == "error" and error.error.code == "duplicate_tool_output"
    await conn.response.inject(response_id=target, input=[output(calls[1].call_id, "noon")])
    events = await until(conn, *TERMINAL)
    assert text(events[-1].response) == "Based on the tool results: rain; noon"
    await conn.response.inject(response_id=target, input=unknown)
    late = await recv(conn)
    assert late.type == "response.inject.failed"
    assert late.error.code == "response_already_completed"


async def test_without_the_beta_a_standard_response_is_no_target(connect: Connect) -> None:
    """INJECT-1: without `OpenAI-Beta: responses_multi_agent=v1` a standard-mode response is
    not an inject target (the client continues it with a create, §7)."""
    conn = await connect()
    target, calls = await suspended(conn)
    await conn.response.inject(response_id=target, input=[output(calls[0].call_id, "rain")])
    failed = await recv(conn)
    assert failed.type == "response.inject.failed"
    assert failed.error.code == "response_not_found"


async def test_steering_queued_on_the_target_joins_the_injected_continuation(
    connect: Connect,
) -> None:
    """STEER-20, STEER-5, INJECT-5: steering accepted while a standard-mode target waits for
    its calls (`steer.accepted`, then `steer.pending` listing the calls) is committed by the
    continuation the last inject starts: first in its input, and never failed (STEER-9)."""
    conn = await connect(BETA)
    target, calls = await suspended(conn)
    await conn.response.steer(previous_response_id=target, input="Answer in one word.")
    accepted, pending = await recv(conn), await recv(conn)
    assert (accepted.type, pending.type) == ("response.steer.accepted", "response.steer.pending")
    assert {s.call_id for s in pending.required_input} == {c.call_id for c in calls}
    both = [output(calls[0].call_id, "rain"), output(calls[1].call_id, "noon")]
    await conn.response.inject(response_id=target, input=both)
    events = await until(conn, *TERMINAL)
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.inject.created", "response.created"]
    assert "response.steer.failed" not in kinds
    assert events[-1].response.previous_response_id == target
    assert events[-1].response.status == "completed"
