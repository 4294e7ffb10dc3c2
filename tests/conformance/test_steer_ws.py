"""Steering over WebSocket with the official ``openai`` SDK (STEER-1..STEER-9, SIM-6).

``client.responses.connect()`` sends ``response.steer``; every frame is validated strictly with
the SDK's ``ResponsesServerEvent`` union, so the steer events are the SDK's own types
(``ResponseSteerAcceptedEvent``, ``ResponseSteerPendingEvent``, ``ResponseSteerFailedEvent``).
A scripted backend with gates (MODEL-4) holds a response mid-stream without timing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from openai import AsyncOpenAI
from openai.resources.responses.responses import AsyncResponsesConnection
from openai.types.responses import (
    ResponseSteerAcceptedEvent,
    ResponseSteerFailedEvent,
    ResponseSteerPendingEvent,
)

from engine.core import EngineConfig
from engine.models.base import CallEnd, CallStart, TextDelta
from engine.models.router import Router
from engine.models.sim.scripted import ScriptedModel, ScriptStep
from protocol.items import Message, text_of
from tests.conformance.sdk_ws import call_output, create, final, recv, until_done
from tests.support.server import LiveServer
from tests.support.tools import WEATHER
from tests.support.wait import wait_for
from tests.support.ws import HeldTerminal, HeldWrite


@pytest.fixture
async def connect(
    server_factory: Callable[..., Any],
) -> AsyncIterator[Callable[..., Any]]:
    """``make(turns)`` starts a server on a ScriptedModel (or the simulator when ``turns`` is
    None, at ``tps``) and returns a connected SDK WebSocket."""
    stack: list[Any] = []

    async def make(
        turns: list[list[ScriptStep]] | None = None, tps: float = 0
    ) -> tuple[AsyncResponsesConnection, LiveServer, ScriptedModel | None]:
        model = ScriptedModel(turns) if turns is not None else None
        router = Router(routes={}, default=model) if model is not None else None
        live: LiveServer = await server_factory(EngineConfig(tokens_per_second=tps), router)
        client = AsyncOpenAI(base_url=live.base_url, api_key="x", max_retries=0)
        manager = client.responses.connect()
        conn = await manager.__aenter__()
        stack.append((client, manager))
        return conn, live, model

    try:
        yield make
    finally:
        for client, manager in reversed(stack):
            await manager.__aexit__(None, None, None)
            await client.close()


async def until(conn: AsyncResponsesConnection, kind: str) -> list[Any]:
    events: list[Any] = []
    while not events or events[-1].type != kind:
        events.append(await recv(conn))
    return events


def context_texts(model: ScriptedModel, request: int) -> list[str]:
    items = model.requests[request].context.items
    return [text_of(i.content) for i in items if isinstance(i, Message) and i.role == "user"]


async def test_steer_during_streaming_ends_steered_and_a_successor_answers(
    connect: Callable[..., Any],
) -> None:
    """STEER-2, STEER-3, STEER-4: accepted while sampling; at the next sampling boundary the
    response ends ``incomplete`` (``steered``) with the cut message ``incomplete``; a successor
    (``previous_response_id`` = the steered one, same settings) starts with the steering input
    and the model restarts on the new context."""
    gate = asyncio.Event()
    turns: list[list[ScriptStep]] = [
        [TextDelta("Once"), gate, TextDelta(" upon a time")],
        [TextDelta("Short answer.")],
    ]
    conn, _, model = await connect(turns)
    await conn.response.create(model="m", input="Tell me a long story", instructions="be nice")
    head = await until(conn, "response.output_text.delta")
    first_id = head[0].response.id
    await conn.response.steer(previous_response_id=first_id, input="Be brief.")
    accepted = await recv(conn)
    assert isinstance(accepted, ResponseSteerAcceptedEvent)
    assert accepted.steer.previous_response_id == first_id and accepted.steer.id
    assert accepted.sequence_number == head[-1].sequence_number + 1  # the target's counter
    gate.set()
    cut = await until_done(conn)
    steered = final(cut)
    assert steered.id == first_id and steered.status == "incomplete"
    assert steered.incomplete_details is not None
    assert steered.incomplete_details.reason == "steered"
    assert [item.status for item in steered.output] == ["incomplete"]
    assert steered.output[0].content[0].text == "Once"
    assert [e.sequence_number for e in [*head, accepted, *cut]] == list(
        range(len(head) + 1 + len(cut))
    )
    successor_events = await until_done(conn)
    assert successor_events[0].type == "response.created"  # the commit point
    successor = final(successor_events)
    assert successor.status == "completed" and successor.output_text == "Short answer."
    assert successor.previous_response_id == first_id and successor.instructions == "be nice"
    assert model is not None and context_texts(model, 1) == ["Tell me a long story", "Be brief."]


async def test_simulator_reacts_visibly_to_steering(connect: Callable[..., Any]) -> None:
    """SIM-6: the simulator's successor answers the steering text itself."""
    conn, _, _ = await connect(None, tps=20)  # paced: the steer lands mid-answer
    story = "a long story about " + " ".join(["dragons"] * 60)
    await conn.response.create(model="sim", input=story)
    head = await until(conn, "response.output_text.delta")
    await conn.response.steer(previous_response_id=head[0].response.id, input="Talk about cats")
    events = await until(conn, "response.incomplete")
    assert isinstance(events[0], ResponseSteerAcceptedEvent)
    successor = final(await until_done(conn))
    assert successor.output_text == "This is a simulated answer to: Talk about cats"


async def test_steer_twice_in_a_row_keeps_submission_order(connect: Callable[..., Any]) -> None:
    """STEER-2: each submission is accepted with its own id; both join one successor's input,
    in submission order."""
    gate = asyncio.Event()
    turns: list[list[ScriptStep]] = [[TextDelta("a"), gate, TextDelta("b")], [TextDelta("done")]]
    conn, live, model = await connect(turns)
    await conn.response.create(model="m", input="start", store=True)
    head = await until(conn, "response.output_text.delta")
    rid = head[0].response.id
    await conn.response.steer(previous_response_id=rid, input="first")
    await conn.response.steer(
        previous_response_id=rid,
        input=[
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "second"}],
            }
        ],
    )
    acks = [await recv(conn), await recv(conn)]
    assert all(isinstance(a, ResponseSteerAcceptedEvent) for a in acks)
    assert acks[0].steer.id != acks[1].steer.id
    gate.set()
    assert final(await until_done(conn)).incomplete_details.reason == "steered"
    successor = final(await until_done(conn))
    assert model is not None and context_texts(model, 1) == ["start", "first", "second"]
    record = await live.engine.store.get(successor.id)
    assert record is not None
    assert [text_of(i.content) for i in record.input_items] == ["first", "second"]


async def test_steer_racing_the_terminal_gets_an_automatic_successor(
    connect: Callable[..., Any],
) -> None:
    """STEER-3: input accepted just before the step ends on its own is not lost: the response
    completes normally and a successor follows with the input."""
    gate = asyncio.Event()
    turns: list[list[ScriptStep]] = [[TextDelta("whole answer"), gate], [TextDelta("and more")]]
    conn, _, model = await connect(turns)
    await conn.response.create(model="m", input="q")
    head = await until(conn, "response.output_text.delta")
    await conn.response.steer(previous_response_id=head[0].response.id, input="also this")
    assert isinstance(await recv(conn), ResponseSteerAcceptedEvent)
    gate.set()  # the model finishes without another delta: no boundary is reached
    first = final(await until_done(conn))
    assert first.status == "completed" and first.output_text == "whole answer"
    successor = final(await until_done(conn))
    assert successor.previous_response_id == first.id and successor.output_text == "and more"
    assert model is not None and context_texts(model, 1) == ["q", "also this"]
    await conn.response.steer(previous_response_id=first.id, input="late")  # now it is over
    late = await recv(conn)
    assert isinstance(late, ResponseSteerFailedEvent)
    assert late.error.code == "response_already_completed" and late.steer.input == "late"


async def test_steer_answering_a_terminal_frame_still_in_its_send_is_already_completed(
    connect: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """STEER-7: the terminal frame is on the wire while its send still waits (a socket
    draining); a steer sent on reading it is ``response_already_completed``, never
    ``response_not_found`` (seen in the live fuzzer, seed 3875029879)."""
    terminal = HeldTerminal(monkeypatch)
    conn, _, _ = await connect([[TextDelta("the answer")]])
    await conn.response.create(model="m", input="q")
    first = final(await until_done(conn))
    assert terminal.held.is_set()
    await conn.response.steer(previous_response_id=first.id, input="late")
    late = await recv(conn)
    terminal.release()
    assert isinstance(late, ResponseSteerFailedEvent)
    assert late.error.code == "response_already_completed" and late.steer.input == "late"


async def test_steer_during_the_terminal_events_durable_write_is_refused_after_it(
    connect: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """STEER-7: between a response's terminal event being built and its frame being sent
    comes its durable write (STORE-6). A steer arriving then is refused as already completed,
    but only after the terminal frame: the client never hears "completed" before the
    response's own end (the live fuzzer, seed 1376857138)."""
    conn, live, _ = await connect([[TextDelta("the answer")]])
    write = HeldWrite(monkeypatch, live.engine.store, "steer")
    await conn.response.create(model="m", input="q", store=True)
    created = await recv(conn)
    await wait_for(write.held.is_set, "the terminal event's durable write")
    await conn.response.steer(previous_response_id=created.response.id, input="late")
    await wait_for(write.read.is_set, "the server to read the steer")
    write.release()
    events = [await recv(conn)]
    while events[-1].type != "response.steer.failed":
        events.append(await recv(conn))
    assert events[-2].type == "response.completed", [e.type for e in events]
    assert events[-1].error.code == "response_already_completed"
    assert events[-1].steer.input == "late"


async def test_steer_while_waiting_for_tool_outputs_is_pending_then_prepended(
    connect: Callable[..., Any],
) -> None:
    """STEER-5: steering a response that stopped for client tool outputs gives
    ``response.steer.pending`` with the required_input stubs; the input is prepended to the
    continuation's input, in submission order, and the simulator shows it (SIM-6)."""
    conn, live, _ = await connect(None)
    done = final(await create(conn, input="Weather in Paris?", tools=[WEATHER]))
    call = done.output[0]
    await conn.response.steer(previous_response_id=done.id, input="Answer in French")
    accepted, pending = await recv(conn), await recv(conn)
    assert isinstance(accepted, ResponseSteerAcceptedEvent)
    assert isinstance(pending, ResponseSteerPendingEvent)
    assert pending.reason == "waiting_for_required_input"
    assert pending.steer.id == accepted.steer.id
    stub = pending.required_input[0]
    assert (stub.type, stub.call_id, stub.name) == (
        "function_call_output",
        call.call_id,
        "get_weather",
    )
    assert pending.sequence_number == accepted.sequence_number + 1
    answer = final(
        await create(
            conn,
            previous_response_id=done.id,
            input=[call_output(call.call_id, "sunny")],
            tools=[WEATHER],
        )
    )
    assert answer.output_text == "Based on the tool results: sunny (steered: Answer in French)"
    assert live.engine.counters["create.fast_path"] == 1  # the same coroutine resumed
    record = await live.engine.store.get(answer.id)
    assert record is not None
    kinds = [type(item).__name__ for item in record.input_items]
    assert kinds == ["Message", "FunctionCallOutput"]


async def test_steer_failures_return_the_input(connect: Callable[..., Any]) -> None:
    """STEER-6, STEER-7: unknown targets, invalid input and a rollout retired before the input
    was committed all answer ``response.steer.failed`` with the uncommitted input."""
    conn, _, _ = await connect(None)
    await conn.response.steer(previous_response_id="resp_nope", input="x")
    unknown = await recv(conn)
    assert isinstance(unknown, ResponseSteerFailedEvent)
    assert unknown.error.code == "response_not_found" and unknown.steer.input == "x"
    done = final(await create(conn, input="Weather in Oslo?", tools=[WEATHER]))
    await conn.send(
        {
            "type": "response.steer",
            "previous_response_id": done.id,
            "input": [{"role": "assistant", "content": "not a user message"}],
        }
    )
    invalid = await recv(conn)
    assert isinstance(invalid, ResponseSteerFailedEvent) and invalid.error.code == "invalid_input"
    assert invalid.steer.id is None  # refused before an id was allocated
    await conn.response.steer(previous_response_id=done.id, input="keep it short")
    assert isinstance(await recv(conn), ResponseSteerAcceptedEvent)
    assert isinstance(await recv(conn), ResponseSteerPendingEvent)
    # An unrelated create on the lane replaces the cached response: its rollout is retired and
    # the queued steer comes back.
    events = await create(conn, input="something else")
    failed = [e for e in events if e.type == "response.steer.failed"]
    if not failed:
        failed = [await recv(conn)]
    assert failed[0].error.code == "response_not_active"
    assert failed[0].steer.input == "keep it short" and failed[0].steer.id


async def test_append_mode_steering(connect: Callable[..., Any]) -> None:
    """STEER-3, STEER-5 in append mode: pending while suspended; the input joins the context
    after the appended tool outputs and the same response samples again."""
    gate = asyncio.Event()
    turns: list[list[ScriptStep]] = [
        [CallStart("call_1", "get_weather"), CallEnd()],
        [TextDelta("after outputs")],
    ]
    conn, _, model = await connect(turns)
    await conn.send(
        {"type": "response.create", "model": "m", "input": "w", "tools": [WEATHER],
         "rollout_mode": "append"}
    )  # fmt: skip
    frames: list[dict[str, Any]] = []
    while not frames or frames[-1]["type"] != "response.done":
        frames.append(await _raw(conn))
    rid = frames[0]["response"]["id"]
    await conn.response.steer(previous_response_id=rid, input="hurry")
    assert isinstance(await recv(conn), ResponseSteerAcceptedEvent)
    assert isinstance(await recv(conn), ResponseSteerPendingEvent)
    await conn.send(
        {"type": "response.append", "response_id": rid,
         "input": [call_output("call_1", "rain")]}
    )  # fmt: skip
    end = final(await until_done(conn))
    assert end.id == rid and end.output_text == "after outputs"
    assert model is not None
    items = model.requests[1].context.items
    # (the context object is live: the last item is the answer sampled from it)
    assert [type(i).__name__ for i in items[-3:-1]] == ["FunctionCallOutput", "Message"]
    del gate


async def _raw(conn: AsyncResponsesConnection) -> dict[str, Any]:
    import json

    return json.loads(await asyncio.wait_for(conn.recv_bytes(), 10))
