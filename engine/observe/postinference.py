"""Post-inference: the billing ledger and metrics, once per response (standard mode) or once per
rollout (append mode), off the critical path (SPEC: POST-1..POST-4).

A single owned worker drains a bounded queue. The rollout hands its record over after the
terminal frame is on the wire, so the client's next request never waits for this work. The
ledger is append-only JSONL (one record per line); ``stop()`` drains the queue and closes it, so
nothing is lost on shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import msgspec

from engine.fifo import Fifo
from engine.observe.metrics import Metrics
from engine.observe.tracing import TurnTrace

log = logging.getLogger("rollout.post")
_LEDGER = msgspec.json.Encoder()


@dataclass(slots=True)
class UsageRecord:
    rollout_id: str
    mode: str  # "append" | "standard"
    model: str
    response_ids: list[str]  # the response billed (standard) or the rollout's one response
    status: str
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    samples: int
    tool_calls: int
    safety_findings: dict[str, int] = field(default_factory=dict)
    stage_seconds: dict[str, float] = field(default_factory=dict)  # this record's stages
    stage_runs: dict[str, int] = field(default_factory=dict)  # runs since the last record
    stage_tokens: dict[str, int] = field(default_factory=dict)
    resume_tokens: list[int] = field(default_factory=list)
    ended_at: float = field(default_factory=time.time)
    trace: TurnTrace | None = None  # the response's span, with tracing on (OTEL-3)


class PostInference:
    """Owns the post-inference worker, the recent-records window and the JSONL ledger."""

    def __init__(self, metrics: Metrics, max_queue: int, ledger_path: Path | None = None) -> None:
        self.metrics = metrics
        self._queue: Fifo[UsageRecord] = Fifo(max_queue)
        self._task: asyncio.Task[None] | None = None
        self.ledger_path = ledger_path
        self._ledger: IO[str] | None = None
        self.recent: deque[UsageRecord] = deque(maxlen=2048)  # a window for tests and debugging
        self.runs = 0
        self._response_children: dict[tuple[str, str], Any] = {}  # (mode, status): a few
        # --bench-timings: told each record's accounting time (OBS-5); None otherwise.
        self.on_accounted: Callable[[list[str], float], None] | None = None
        self._token_children = tuple(
            metrics.tokens.labels(k) for k in ("input", "cached", "output")
        )

    async def start(self) -> None:
        if self._task is None:
            if self.ledger_path is not None:
                self._ledger = self.ledger_path.open("a", encoding="utf-8")
            self._task = asyncio.create_task(self._work(), name="post-inference")

    async def stop(self) -> None:
        """Drain everything queued, then stop the worker and close the ledger."""
        if self._task is None:
            return
        await self._queue.join()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
        if self._ledger is not None:
            self._ledger.close()
            self._ledger = None

    async def submit(self, record: UsageRecord) -> None:
        await self._queue.put(record)

    def submit_nowait(self, record: UsageRecord) -> None:
        """For cancelled rollouts, which cannot await; the record is never dropped silently."""
        try:
            self._queue.put_nowait(record)
        except asyncio.QueueFull:
            log.error("post-inference queue full; accounting inline for %s", record.rollout_id)
            self._account(record)

    async def _work(self) -> None:
        while True:
            record = await self._queue.get()
            try:
                self._account(record)
            except Exception:
                log.exception("post-inference failed for rollout %s", record.rollout_id)
            finally:
                self._queue.task_done()

    def _account(self, record: UsageRecord) -> None:
        trace = record.trace
        if trace is not None:
            started = time.time_ns()
            self._account_once(record)
            trace.post_inference(started, time.time_ns())
            return
        self._account_once(record)

    def _account_once(self, record: UsageRecord) -> None:
        start = time.perf_counter()
        self.runs += 1
        self.recent.append(record)
        self._observe(record)
        if self._ledger is not None:
            # Encoded by msgspec (a dataclass encodes directly, no ``asdict`` copy). The buffered
            # file is flushed when the queue is drained, so a burst of records costs one write
            # system call on the loop's thread, not one per record; nothing waits in the buffer
            # once the worker is idle, and ``stop`` drains and closes it.
            self._ledger.write(_LEDGER.encode(record).decode() + "\n")
            if self._queue.empty():  # no record is waiting behind this one
                self._ledger.flush()
        seconds = time.perf_counter() - start
        self.metrics.pending.observe("post", seconds)
        if self.on_accounted is not None:
            self.on_accounted(record.response_ids, seconds)

    def _observe(self, record: UsageRecord) -> None:
        """The record's metrics, counted now and folded in when read (``Pending``, OBS-3)."""
        m, pending = self.metrics, self.metrics.pending
        for stage, seconds in record.stage_seconds.items():
            pending.observe(stage, seconds)
        key = (record.mode, record.status)
        child = self._response_children.get(key)
        if child is None:  # looked up once per pair (``labels`` costs ~5 us)
            child = self._response_children[key] = m.responses.labels(*key)
        pending.inc(child)
        input_, cached, output = self._token_children
        pending.inc(input_, record.input_tokens)
        pending.inc(cached, record.cached_tokens)
        pending.inc(output, record.output_tokens)
        for kind, n in record.safety_findings.items():
            m.findings.labels(kind).inc(n)

    def records_for(self, response_id: str) -> list[UsageRecord]:
        return [r for r in self.recent if response_id in r.response_ids]
