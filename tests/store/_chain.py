"""A tool-calling conversation driven turn by turn over HTTP or WebSocket against any server.

Each continuation proves hydration worked: a ``function_call_output`` is accepted only when the
call it answers is in the context the server rebuilt, and ``input_tokens`` (the whole prompt)
must grow turn after turn.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import aiohttp

TOOL = {
    "type": "function",
    "name": "lookup",
    "description": "Look something up.",
    "parameters": {
        "type": "object",
        "properties": {"q": {"type": "string"}},
        "required": ["q"],
    },
}
TERMINAL = ("response.completed", "response.incomplete", "response.failed")


@dataclass
class Reply:
    """A finished create: the final Response, or the error that replaced it."""

    status: int
    response: dict[str, Any] | None = None
    error: dict[str, Any] | None = None

    @property
    def id(self) -> str:
        assert self.response is not None, self.error
        rid: str = self.response["id"]
        return rid

    @property
    def code(self) -> str | None:
        return None if self.error is None else self.error.get("code")


def next_input(prev: dict[str, Any] | None, step: int) -> list[dict[str, Any]]:
    """Answer the previous response's tool call, or ask something that makes a new one."""
    calls = [o for o in (prev or {}).get("output", []) if o["type"] == "function_call"]
    if calls:
        return [
            {"type": "function_call_output", "call_id": c["call_id"], "output": f"found {step}"}
            for c in calls
        ]
    return [{"type": "message", "role": "user", "content": f"step {step}: please lookup x{step}"}]


def body(prev: dict[str, Any] | None, step: int, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"model": "sim", "input": next_input(prev, step), "tools": [TOOL]}
    if prev is not None:
        out["previous_response_id"] = prev["id"]
    out.update(extra)
    return out


async def http_create(http: aiohttp.ClientSession, base: str, payload: dict[str, Any]) -> Reply:
    async with http.post(f"{base}/v1/responses", json=payload) as resp:
        data = await resp.json()
        if resp.status == 200:
            return Reply(200, response=data)
        return Reply(resp.status, error=data["error"])


async def ws_create(ws: aiohttp.ClientWebSocketResponse, payload: dict[str, Any]) -> Reply:
    await ws.send_str(json.dumps({"type": "response.create", **payload}))
    while True:
        msg = await ws.receive(timeout=30)
        if msg.type is not aiohttp.WSMsgType.TEXT:
            raise ConnectionError(f"socket ended: {msg.type!r}")
        event = json.loads(msg.data)
        if event["type"] in TERMINAL:
            return Reply(200, response=event["response"])
        if event["type"] == "error":
            return Reply(event["status"], error=event["error"])


@dataclass
class Chain:
    """The acknowledged responses of one conversation, in order."""

    acked: list[dict[str, Any]] = field(default_factory=list)

    @property
    def last(self) -> dict[str, Any] | None:
        return self.acked[-1] if self.acked else None

    def accept(self, reply: Reply) -> dict[str, Any]:
        assert reply.response is not None, reply.error
        assert reply.response["status"] == "completed", reply.response
        prev = self.last
        if prev is not None:
            assert reply.response["previous_response_id"] == prev["id"]
            grown = reply.response["usage"]["input_tokens"]
            assert grown > prev["usage"]["input_tokens"], "the continuation saw the history"
        self.acked.append(reply.response)
        return reply.response


async def fork_from(http: aiohttp.ClientSession, base: str, parent: dict[str, Any]) -> None:
    """Continue from ``parent`` once and check the continuation saw its whole history."""
    reply = await http_create(http, base, body(parent, 99))
    Chain([parent]).accept(reply)
