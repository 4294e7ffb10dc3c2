"""What every load agent shares (LOAD-1, LOAD-2): the request bodies' tools and outputs, the
counts over all connections, and the per-socket frame checker."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgspec

TERMINALS = frozenset({"response.completed", "response.failed", "response.incomplete"})
DELTAS = frozenset({"response.output_text.delta", "response.function_call_arguments.delta"})
TOOLS = [
    {"type": "function", "name": name, "parameters": {"type": "object", "properties": {}}}
    for name in ("list_dir", "read_file", "search", "edit_file", "run_tests")
]
OUTPUT = "def handler(request):\n    return respond(request.body)\n" * 60  # ~3.4 KB
_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode


@dataclass
class LoadCounts:
    """What the checkers saw, over all connections."""

    responses: int = 0
    turns: int = 0
    misordered: int = 0  # a sequence number that is not the previous one + 1
    lost: int = 0  # a response that never reached its terminal, or events after one
    errors: list[str] = field(default_factory=list)
    overhead_ms: list[float] = field(default_factory=list)
    http_requests: int = 0
    http_failures: int = 0
    acknowledged: list[str] = field(default_factory=list)  # completed, store: true (LOAD-2)
    reconnects: int = 0
    reconnect_ms: list[float] = field(default_factory=list)  # drain signal -> new socket
    http_failure_kinds: Counter[str] = field(default_factory=Counter)  # status and code
    drain_signals: Counter[str] = field(default_factory=Counter)  # by documented kind
    # time.monotonic() (one clock for every process) when the first agent started and the last
    # finished: the wall time of the run, however many client processes shared it
    window: tuple[float, float] = (0.0, 0.0)

    def merge(self, other: LoadCounts) -> None:
        """Add another client process's counts to these (LOAD-3)."""
        for name in ("responses", "turns", "misordered", "lost", "http_requests"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.http_failures += other.http_failures
        self.reconnects += other.reconnects
        self.reconnect_ms += other.reconnect_ms
        self.errors += other.errors
        self.overhead_ms += other.overhead_ms
        self.acknowledged += other.acknowledged
        self.drain_signals.update(other.drain_signals)
        self.http_failure_kinds.update(other.http_failure_kinds)
        if self.window == (0.0, 0.0):
            self.window = other.window
        else:
            self.window = (
                min(self.window[0], other.window[0]),
                max(self.window[1], other.window[1]),
            )


class Checker:
    """Reads one socket's frames and checks the per-response ordering invariants."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, counts: LoadCounts) -> None:
        self.ws, self.counts = ws, counts
        self.expected = 0

    async def until(self, *types: str, sent_at: float) -> dict[str, Any]:
        first_delta = True
        while True:
            msg = await self.ws.receive(timeout=60)
            if msg.type is not aiohttp.WSMsgType.TEXT:  # counted as lost by the caller
                raise ConnectionError(f"socket ended: {msg.type}")
            event: dict[str, Any] = _decode(msg.data)
            if event["type"] == "error":
                self.counts.errors.append(event["error"]["code"])
                raise ConnectionError(event["error"]["code"])
            if event.get("sequence_number") != self.expected:
                self.counts.misordered += 1
            self.expected = event.get("sequence_number", self.expected) + 1
            if first_delta and event["type"] in DELTAS:
                first_delta = False
                self.counts.overhead_ms.append((time.perf_counter() - sent_at) * 1000)
            if event["type"] in types:
                return event

    async def send(self, body: dict[str, Any]) -> float:
        await self.ws.send_str(_encode(body).decode())
        return time.perf_counter()


def tool_output(call_id: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": OUTPUT}
