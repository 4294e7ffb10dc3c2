"""The lean measuring client's wire layer: one event reader for every mode, clock reads at arrival
(SSE bytes are split into events by the shared ``protocol.sse.SseDecoder``).

Why not ``clients.*``: those build typed events and check every ordering rule, which is right
for an agent but is client cost. Here every event is decoded only as far as its ``type``
(msgspec, decoder built once), and only a turn's terminal event is decoded fully. Every mode uses
this same code, so client overhead is identical across modes and the differences measured are
the server's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import msgspec

from clients.bench.scenario import Call

DELTA_TYPES = frozenset({"response.output_text.delta", "response.function_call_arguments.delta"})
FIRST_ITEM = "response.output_item.added"
FAILED_TYPES = frozenset({"response.failed", "response.incomplete", "error"})


class _Head(msgspec.Struct):
    type: str


class _Usage(msgspec.Struct):
    input_tokens: int = 0
    output_tokens: int = 0


class _Response(msgspec.Struct):
    id: str
    status: str = ""
    output: list[dict[str, Any]] = []
    usage: _Usage | None = None


class _Pending(msgspec.Struct):
    call_id: str


class _Terminal(msgspec.Struct):
    type: str
    response: _Response | None = None
    pending_calls: list[_Pending] | None = None
    error: dict[str, Any] | None = None


_HEAD = msgspec.json.Decoder(_Head)
_TERMINAL = msgspec.json.Decoder(_Terminal)
ENCODER = msgspec.json.Encoder()


class BenchError(RuntimeError):
    """The server refused or failed a turn (the run is invalid, not slow)."""


@dataclass
class TurnResult:
    """One model turn as the client saw it: what to do next, and when each thing arrived."""

    t_send: float
    t_first_item: float | None = None
    t_first_delta: float | None = None
    t_last_delta: float | None = None  # the model's last delta: what follows is the turn's tail
    t_end: float = 0.0
    response_id: str = ""
    calls: list[Call] = field(default_factory=list)
    output: list[dict[str, Any]] = field(default_factory=list)
    input_tokens: int | None = None
    events: int = 0
    server_cpu_ns: int | None = None  # the server's CPU time over the whole turn
    server_wait_ns: int | None = None  # the server's time waiting for a CPU over the turn
    server_written: int | None = None  # bytes the server wrote over the turn (/proc/PID/io)
    server: dict[str, Any] | None = None  # the server's own timing record (OBS-5), if served


class RawTurnReader:
    """Folds raw event payloads into a ``TurnResult``; ``feed`` returns True at the turn's end.

    ``append=True``: a turn ends at ``response.done`` (tools pending) or the terminal event."""

    def __init__(self, t_send: float, *, append: bool) -> None:
        self.turn = TurnResult(t_send=t_send)
        self.append = append

    def feed(self, raw: bytes | str, now: float) -> bool:
        turn = self.turn
        turn.events += 1
        kind = _HEAD.decode(raw).type
        if kind in DELTA_TYPES:
            if turn.t_first_delta is None:
                turn.t_first_delta = now
            turn.t_last_delta = now
            return False
        if kind == FIRST_ITEM:
            if turn.t_first_item is None:
                turn.t_first_item = now
            return False
        if kind in FAILED_TYPES:
            raise BenchError(f"server sent {kind}: {raw[:300]!r}")
        if kind == "response.completed" or (self.append and kind == "response.done"):
            self._end(_TERMINAL.decode(raw), now)
            return True
        return False

    def _end(self, event: _Terminal, now: float) -> None:
        turn, response = self.turn, event.response
        assert response is not None
        turn.t_end = now
        turn.response_id = response.id
        turn.input_tokens = response.usage.input_tokens if response.usage else None
        if event.pending_calls is not None:  # append: the pending calls, from the snapshot
            wanted = {p.call_id for p in event.pending_calls}
            turn.output = [i for i in response.output if i.get("call_id") in wanted]
        elif self.append:  # append's terminal: the final turn's items are not needed
            turn.output = []
        else:
            turn.output = response.output
        turn.calls = [
            Call(i["call_id"], i["name"], i["arguments"])
            for i in turn.output
            if i.get("type") == "function_call"
        ]


def now() -> float:
    return time.perf_counter()
