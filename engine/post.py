"""Post-inference: usage accounting and metrics, once per rollout, off the critical path.

A single owned worker drains a bounded queue (SPEC: POST-1..POST-3). The rollout hands its record
over after its terminal frame is on the wire, so the client's next request never waits for this
work. ``stop()`` drains the queue, so nothing is lost on shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import Counter, deque
from dataclasses import asdict, dataclass, field
from pathlib import Path

log = logging.getLogger("rollout.post")


@dataclass(slots=True)
class UsageRecord:
    rollout_id: str
    mode: str  # "append" | "standard"
    model: str
    response_ids: list[str]
    status: str
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    samples: int
    tool_calls: int
    safety_findings: int
    stage_runs: dict[str, int] = field(default_factory=dict)
    stage_tokens: dict[str, int] = field(default_factory=dict)
    resume_tokens: list[int] = field(default_factory=list)
    stage_seconds: dict[str, float] = field(default_factory=dict)


class PostInference:
    """Owns the post-inference worker, the in-memory ledger and an optional JSONL ledger."""

    def __init__(self, max_queue: int = 4096, ledger_path: Path | None = None) -> None:
        self._queue: asyncio.Queue[UsageRecord] = asyncio.Queue(maxsize=max_queue)
        self._task: asyncio.Task[None] | None = None
        self.ledger_path = ledger_path
        self.recent: deque[UsageRecord] = deque(maxlen=10_000)
        self.totals: Counter[str] = Counter()
        self.runs = 0

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._work(), name="post-inference")

    async def stop(self) -> None:
        """Drain everything queued, then stop the worker."""
        if self._task is None:
            return
        await self._queue.join()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None

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
        self.runs += 1
        self.recent.append(record)
        self.totals["rollouts"] += 1
        self.totals["input_tokens"] += record.input_tokens
        self.totals["cached_tokens"] += record.cached_tokens
        self.totals["output_tokens"] += record.output_tokens
        if self.ledger_path is not None:
            with self.ledger_path.open("a", encoding="utf-8") as ledger:
                ledger.write(json.dumps(asdict(record)) + "\n")

    def records_for(self, response_id: str) -> list[UsageRecord]:
        return [r for r in self.recent if response_id in r.response_ids]
