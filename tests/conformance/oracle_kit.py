"""The oracle tests' servers and raw turns: a backend that fails, raw WebSocket and SSE turns."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any

import aiohttp
from openai.resources.responses.responses import AsyncResponsesConnection

from engine.models.base import (
    ArgsDelta,
    Backend,
    BackendError,
    CallStart,
    Delta,
    Finish,
    ReasoningDelta,
    SampleRequest,
    TextDelta,
)
from engine.models.router import Router
from engine.models.sim.simulator import SimulatedModel
from tests.support.server import LiveServer

MODEL = "gpt-x"


TERMINAL = {"response.completed", "response.failed", "response.incomplete"}
WEATHER: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"],
        "additionalProperties": False,
    },
    "strict": True,
}


CLOCK: dict[str, Any] = {**WEATHER, "name": "get_time"}


class BrokenModel(Backend):
    """A backend that fails: before any output, mid-message, or mid-function-call."""

    name = "broken"
    supports = frozenset({"text"})

    def __init__(self, where: str) -> None:
        self.where = where
        self.calls = 0

    async def stream(self, request: SampleRequest) -> AsyncGenerator[Delta, None]:
        self.calls += 1
        if self.where == "message":
            yield TextDelta("partial ")
            yield TextDelta("answer")
        elif self.where == "call":
            yield CallStart("call_broken0", "get_weather")
            yield ArgsDelta('{"city":')
        raise BackendError("upstream exploded: secret-internal-detail")


class ThinkingModel(Backend):
    """Reasoning, then an answer (REASON-2), as a ``tokens`` route with a reasoning parser
    streams it."""

    name = "thinking"
    supports = frozenset({"text"})

    async def stream(self, request: SampleRequest) -> AsyncGenerator[Delta, None]:
        yield ReasoningDelta("Let me ")
        yield ReasoningDelta("think.")
        yield TextDelta("Done.")
        yield Finish("stop", 4, reasoning_tokens=3)


def broken_router() -> Router:
    """The simulator for every model name, plus ``broken-*`` models whose backend raises and
    ``thinking``, which reasons before it answers."""
    routes: dict[str, Any] = {
        "broken-early": BrokenModel("early"),
        "broken-message": BrokenModel("message"),
        "broken-call": BrokenModel("call"),
        "thinking": ThinkingModel(),
    }
    return Router(routes=routes, default=SimulatedModel(tokens_per_second=0))


async def ws_send_create(conn: AsyncResponsesConnection, **params: Any) -> None:
    await conn.send_raw(json.dumps({"type": "response.create", "model": MODEL, **params}))


async def ws_turn(conn: AsyncResponsesConnection, **params: Any) -> list[dict[str, Any]]:
    """Send one create; raw frames up to its terminal (or a request error)."""
    await ws_send_create(conn, **params)
    return await ws_until_done(conn)


async def ws_until_done(conn: AsyncResponsesConnection) -> list[dict[str, Any]]:
    raws: list[dict[str, Any]] = []
    while True:
        raw = json.loads(await conn.recv_bytes())
        raws.append(raw)
        if raw["type"] in TERMINAL or raw["type"] == "error":
            return raws


async def sse_turn(live: LiveServer, **params: Any) -> list[dict[str, Any]]:
    body = {"model": MODEL, "stream": True, **params}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{live.base_url}/responses", json=body) as resp,
    ):
        assert resp.status == 200, await resp.text()
        text = (await resp.read()).decode()
    raws = []
    for block in filter(None, (b.strip() for b in text.split("\n\n"))):
        event_line, data_line = block.split("\n")
        raw = json.loads(data_line.removeprefix("data: "))
        assert event_line == f"event: {raw['type']}"
        raws.append(raw)
    return raws


async def start_append(
    conn: AsyncResponsesConnection, text: str
) -> tuple[list[dict[str, Any]], str, dict[str, str]]:
    """Open an append-mode rollout with one tool; frames up to its ``response.done``."""
    await ws_send_create(conn, input=text, tools=[WEATHER], store=False, rollout_mode="append")
    raws: list[dict[str, Any]] = []
    while not raws or raws[-1]["type"] != "response.done":
        raws.append(json.loads(await conn.recv_bytes()))
    (pending,) = raws[-1]["pending_calls"]
    return raws, raws[-1]["response"]["id"], pending


def types_of(raws: list[dict[str, Any]]) -> list[str]:
    return [r["type"] for r in raws]
