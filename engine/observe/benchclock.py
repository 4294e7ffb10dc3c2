"""Per-turn stage timings from the server's own clocks, for the benchmark (SPEC: OBS-5).

Off unless ``rollout serve --bench-timings``: then the engine holds a ``BenchClock``, transports
wrap their sinks in timed ones, and ``GET /v1/bench/timings`` hands the records over (and
clears them). When it is off nothing here is constructed, and the hot paths pay one ``is None``
test per turn (no extra clock reads, no per-event work).

One record per model turn: a standard-mode response, or each sampling step of an append-mode
response (same ``response_id``, ``turn`` counting up). Stages, in seconds:

* ``decode``: decoding the request frame or body (per connection, since its previous record);
* ``queue``, ``route``, ``header``, ``validate``, ``scan``, ``render``: as OBS-1, for this turn;
* ``pre_inference``: their sum (everything between the request's bytes and the coroutine's
  wake-up, decode included);
* ``dispatch``: from pre-inference's end (the rollout resumed or spawned) to the model's start;
* ``ttft``, ``model``: as OBS-1 (``model`` includes writing the turn's events);
* ``send``: encoding and writing the turn's events (the timed sink's own time);
* ``post``: post-inference of the turn's ledger record (standard mode; 0 until it ran).

``prompt_tokens`` is the prompt the model read at this turn (header + history),
``rendered_tokens`` what pre-inference rendered fresh for it, and ``context_tokens`` what the
rollout holds once the turn's output joined it: the bench reports the history's size from
these, so the chat template exists only in ``engine/conversation/render.py``.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Protocol, runtime_checkable

from protocol.events import ServerEvent, Sink

PRE_STAGES = ("decode", "queue", "route", "header", "validate", "scan", "render")


@runtime_checkable
class SelfTiming(Protocol):
    """A sink that keeps its own send and decode seconds (``TimedSink``, the WebSocket
    driver's ``TimedWsSink``)."""

    def take(self) -> tuple[float, float]: ...


class TimedSink:
    """Wraps a transport's sink (HTTP): times each ``send`` and keeps the request's decode time
    for its records. Installed only under ``--bench-timings``."""

    __slots__ = ("_decode", "_send", "inner")

    def __init__(self, inner: Sink) -> None:
        self.inner = inner
        self._send = 0.0
        self._decode = 0.0

    async def send(self, event: ServerEvent) -> None:
        start = time.perf_counter()
        try:
            await self.inner.send(event)
        finally:
            self._send += time.perf_counter() - start

    def add_decode(self, seconds: float) -> None:
        self._decode += seconds

    def take(self) -> tuple[float, float]:
        """(send, decode) seconds since the previous call."""
        taken = self._send, self._decode
        self._send = self._decode = 0.0
        return taken


class BenchClock:
    """The records of the last ``limit`` turns, in completion order."""

    def __init__(self, limit: int = 20_000) -> None:  # ~1 KB each: a bounded 20 MB at most
        self.records: deque[dict[str, Any]] = deque(maxlen=limit)
        self._open: dict[str, dict[str, Any]] = {}  # response id -> its latest record (post)

    def turn(
        self,
        response_id: str,
        turn: int,
        stages: dict[str, float],
        sink: object,
        tokens: tuple[int, int, int],
    ) -> None:
        send, decode = sink.take() if isinstance(sink, SelfTiming) else (0.0, 0.0)
        stages = {**stages, "send": send, "decode": decode, "post": 0.0}
        stages["pre_inference"] = sum(stages.get(name, 0.0) for name in PRE_STAGES)
        record = {
            "response_id": response_id,
            "turn": turn,
            "prompt_tokens": tokens[0],
            "rendered_tokens": tokens[1],
            "context_tokens": tokens[2],
            "stages": stages,
        }
        self.records.append(record)
        self._open[response_id] = record
        if len(self._open) > 4096:
            del self._open[next(iter(self._open))]

    def post(self, response_ids: list[str], seconds: float) -> None:
        for response_id in response_ids:
            record = self._open.pop(response_id, None)
            if record is not None:
                record["stages"]["post"] = seconds

    def take(self) -> list[dict[str, Any]]:
        records = list(self.records)
        self.records.clear()
        return records


def stage_delta(now: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    """Stage seconds added since ``before`` (an append-mode response sums over its turns)."""
    return {name: value - before.get(name, 0.0) for name, value in now.items()}
