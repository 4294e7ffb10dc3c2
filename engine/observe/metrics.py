"""Prometheus metrics (SPEC: OBS-1..OBS-3, WORK-3). One registry per engine, so several engines
(tests, benchmarks) never collide. Stage timings are observed by the post-inference worker, off
the critical path; cache counters are read from the engine at scrape time.

Under ``rollout serve --workers N`` (``PROMETHEUS_MULTIPROC_DIR`` set) every worker's values
live in shared memory-mapped files and any worker's ``/metrics`` aggregates all of them. The
engine's counters are then copied into a shared counter at scrape time and every
``EVENT_SYNC_S`` seconds, so another worker's view of them is at most that old."""

from __future__ import annotations

import asyncio
import bisect
import collections
import os
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
EVENT_SYNC_S = 1.0
_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
)  # fmt: skip


class _EngineCounters(Collector):
    """Exposes the engine's create-path and cache counters without double bookkeeping."""

    def __init__(self, counters: collections.Counter[str]) -> None:
        self._counters = counters

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "rollout_events",
            "Create paths and cache events (fast_path, cache_hit …)",
            labels=["event"],
        )
        for name, value in sorted(self._counters.items()):
            family.add_metric([name], value)
        yield family


class Pending:
    """Observations counted in plain numbers and folded into the Prometheus metrics when they
    are read (OBS-3): a scrape, the inspector, and under ``--workers`` every ``EVENT_SYNC_S``.

    ``prometheus_client`` takes a lock per value and walks a histogram's buckets in Python:
    ~1.2 us per observation, ten of them per record (~16 us, 6% of a WebSocket turn's
    instructions). Here a stage time is a ``bisect`` into the same buckets (one thread, the
    loop's: no lock) and a counter an integer; ``fold`` adds the totals, so what a reader
    sees is what observing each value would have given
    (``tests/engine/observe/test_metrics_fold.py``)."""

    def __init__(self, histogram: Histogram, bounds: Iterable[float]) -> None:
        self.histogram = histogram
        self._bounds = [*bounds, float("inf")]
        self._stages: dict[str, list[float]] = {}  # stage -> [sum, count per bucket ...]
        self._children: dict[str, Any] = {}
        self._counts: dict[Any, float] = {}  # a counter's child -> what to add

    def observe(self, stage: str, seconds: float) -> None:
        row = self._stages.get(stage)
        if row is None:
            row = self._stages[stage] = [0.0] * (len(self._bounds) + 1)
        row[0] += seconds
        # prometheus_client's rule: the first bucket whose bound is >= the value
        row[1 + bisect.bisect_left(self._bounds, seconds)] += 1

    def inc(self, child: Any, amount: float = 1) -> None:
        """``child.inc(amount)`` at the next fold (``child``: a labelled counter)."""
        self._counts[child] = self._counts.get(child, 0) + amount

    def fold(self) -> None:
        for stage, row in self._stages.items():
            if not any(row[1:]):
                continue
            child = self._children.get(stage)
            if child is None:
                child = self._children[stage] = self.histogram.labels(stage)
            child._sum.inc(row[0])
            for value, n in zip(child._buckets, row[1:], strict=True):
                if n:
                    value.inc(n)
            row[:] = [0.0] * len(row)
        counts, self._counts = self._counts, {}
        for counter, amount in counts.items():
            counter.inc(amount)

    def collect(self) -> Iterator[Metric]:
        """The stage histogram, everything observed so far folded in (the inspector's read)."""
        self.fold()
        return iter(self.histogram.collect())


class Metrics:
    def __init__(self, counters: collections.Counter[str]) -> None:
        self.registry = CollectorRegistry()
        self.stage_histogram = Histogram(
            "rollout_stage_seconds",
            "Per-response time per stage: validate, scan, render, header, route, queue, "
            "ttft, model, post",
            ["stage"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.responses = Counter(
            "rollout_responses", "Finished responses", ["mode", "status"], registry=self.registry
        )
        self.tokens = Counter(
            "rollout_tokens", "Tokens by kind (input, cached, output)", ["kind"],
            registry=self.registry,
        )  # fmt: skip
        self.findings = Counter(
            "rollout_safety_findings", "Safety findings by kind", ["kind"], registry=self.registry
        )
        self.pending = Pending(self.stage_histogram, _BUCKETS)
        self.shared_dir = os.environ.get(MULTIPROC_ENV)
        self._counters = counters
        self._synced: collections.Counter[str] = collections.Counter()
        self.events: Counter | None = None
        if self.shared_dir:
            self.events = Counter(
                "rollout_events", "Create paths and cache events (fast_path, cache_hit …)",
                ["event"], registry=self.registry,
            )  # fmt: skip
        else:
            self.registry.register(_EngineCounters(counters))

    def sync_events(self) -> None:
        """Fold what post-inference observed, and copy what the engine counted since the last
        sync into the shared counter."""
        self.pending.fold()
        if self.events is None:
            return
        for name, value in self._counters.items():
            delta = value - self._synced[name]
            if delta > 0:
                self.events.labels(name).inc(delta)
                self._synced[name] = value

    async def sync_forever(self) -> None:
        """The engine's owned task in multiprocess mode: keep other workers' view fresh."""
        while True:
            await asyncio.sleep(EVENT_SYNC_S)
            self.sync_events()

    def render(self) -> bytes:
        if not self.shared_dir:
            self.pending.fold()
            return generate_latest(self.registry)
        self.sync_events()
        merged = CollectorRegistry()
        MultiProcessCollector(merged, path=self.shared_dir)  # type: ignore[no-untyped-call]
        return generate_latest(merged)
