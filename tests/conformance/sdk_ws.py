"""The openai SDK's WebSocket connection as a test client: strict frames, turns, checks."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pydantic
from openai.resources.responses.responses import AsyncResponsesConnection
from openai.types.responses import Response, ResponsesServerEvent

MODEL = "gpt-x"


TERMINAL = {"response.completed", "response.failed", "response.incomplete"}


RECV_TIMEOUT = 10.0


EVENTS: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ResponsesServerEvent)


# Internal text that must never reach a client (ERR-3): Python exception names, tracebacks.
INTERNAL = re.compile(
    r"Traceback|msgspec|pydantic|Exception|Error\(|KeyError|TypeError|ValueError|"
    r"AttributeError|DecodeError|ValidationError|File \""
)


async def recv(conn: AsyncResponsesConnection) -> Any:
    """One frame, strictly validated with the SDK's server-event union."""
    data = await asyncio.wait_for(conn.recv_bytes(), RECV_TIMEOUT)
    return EVENTS.validate_python(json.loads(data))


async def until_done(conn: AsyncResponsesConnection) -> list[Any]:
    """Events up to and including a terminal event or an ``error`` event."""
    events: list[Any] = []
    while True:
        event = await recv(conn)
        events.append(event)
        if event.type in TERMINAL or event.type == "error":
            return events


async def create(conn: AsyncResponsesConnection, **params: Any) -> list[Any]:
    params.setdefault("model", MODEL)
    await conn.response.create(**params)
    return await until_done(conn)


def final(events: list[Any]) -> Response:
    assert events[-1].type in TERMINAL, [e.type for e in events]
    response: Response = events[-1].response
    return response


def check_response_events(events: list[Any]) -> None:
    """§4.1: created first, sequence numbers 0..n, one id, exactly one terminal, last."""
    types = [e.type for e in events]
    assert types[0] == "response.created"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert sum(t in TERMINAL for t in types) == 1 and types[-1] in TERMINAL
    assert len({e.response.id for e in events if hasattr(e, "response")}) == 1


def check_error(event: Any, code: str, status: int = 400, param: str | None = None) -> None:
    assert event.type == "error"
    assert isinstance(event.status, int) and event.status == status
    assert event.error.code == code
    assert event.error.type
    assert event.error.message and not INTERNAL.search(event.error.message)
    if param is not None:
        assert event.error.param == param


def call_output(call_id: str, output: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": output}
