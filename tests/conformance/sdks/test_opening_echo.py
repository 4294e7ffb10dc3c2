"""RESP-5: the request's instructions and tools are echoed once per response, by its terminal
event; ``response.created`` and ``response.in_progress`` carry ``instructions: null`` and
``tools: []`` (``--full-echo``: both, as OpenAI does). Over WebSocket and HTTP/SSE, every frame
parsed by the openai SDK's models, and the SDK's stream helper still ends with the full echo."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pydantic
import pytest
from openai.types.responses import Response, ResponsesServerEvent, ResponseStreamEvent

from engine.core import EngineConfig
from tests.conformance.oracle_kit import MODEL, WEATHER, sse_turn, ws_turn
from tests.support.fixtures import sdk_client
from tests.support.server import LiveServer, start_server

INSTRUCTIONS = "You are a coding agent. " * 400  # Codex-sized: spliced parts (CODEC-6)
OPENING = ("response.created", "response.in_progress")
WS_EVENTS: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ResponsesServerEvent)
SSE_EVENTS: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ResponseStreamEvent)


async def _server(full_echo: bool) -> LiveServer:
    return await start_server(EngineConfig(tokens_per_second=0, full_echo=full_echo))


@pytest.fixture
async def live() -> AsyncIterator[LiveServer]:
    server = await _server(False)
    try:
        yield server
    finally:
        await server.runner.cleanup()


@pytest.fixture
async def full() -> AsyncIterator[LiveServer]:
    server = await _server(True)
    try:
        yield server
    finally:
        await server.runner.cleanup()


async def _both_transports(server: LiveServer) -> list[tuple[list[dict[str, Any]], Any]]:
    """One tool-calling create over WebSocket and one over SSE: raw frames, the SDK's union."""
    params: dict[str, Any] = {
        "input": "Weather in Paris?",
        "instructions": INSTRUCTIONS,
        "tools": [WEATHER],
        "store": False,
    }
    async with sdk_client(server) as client, client.responses.connect() as conn:
        ws = await ws_turn(conn, **params)
    sse = await sse_turn(server, **params)
    return [(ws, WS_EVENTS), (sse, SSE_EVENTS)]


def _lifecycle(raws: list[dict[str, Any]], union: Any) -> dict[str, Response]:
    """The Response of each lifecycle event, every frame parsed by the SDK's models."""
    parsed = [union.validate_python(raw) for raw in raws]
    assert [e.type for e in parsed][:2] == list(OPENING)
    return {e.type: e.response for e in parsed if hasattr(e, "response")}


async def test_opening_events_carry_no_instructions_or_tools(live: LiveServer) -> None:
    """RESP-5, EV-2: created and in_progress have ``instructions: null``, ``tools: []`` and the
    same id, model and settings as the terminal, which echoes both, over WS and SSE."""
    for raws, union in await _both_transports(live):
        responses = _lifecycle(raws, union)
        final = responses["response.completed"]
        assert final.instructions == INSTRUCTIONS
        assert [t.name for t in final.tools] == ["get_weather"]
        for kind in OPENING:
            opening = responses[kind]
            assert opening.instructions is None and opening.tools == []
            assert (opening.id, opening.model, opening.status) == (final.id, MODEL, "in_progress")
            assert opening.tool_choice == final.tool_choice and opening.output == []
    async with sdk_client(live) as client:
        stream = client.responses.stream(
            model=MODEL, input="Weather in Paris?", instructions=INSTRUCTIONS, tools=[WEATHER]
        )
        async with stream as events:
            final_response = await events.get_final_response()
    assert final_response.instructions == INSTRUCTIONS and len(final_response.tools) == 1


async def test_full_echo_copies_them_into_every_lifecycle_event(full: LiveServer) -> None:
    """RESP-5: ``--full-echo`` (``EngineConfig.full_echo``): the opening events echo the
    instructions and tools as the terminal does, as OpenAI sends them."""
    for raws, union in await _both_transports(full):
        responses = _lifecycle(raws, union)
        final = responses["response.completed"]
        for kind in OPENING:
            assert responses[kind].instructions == INSTRUCTIONS
            assert responses[kind].tools == final.tools and len(final.tools) == 1
