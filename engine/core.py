"""The process-wide engine: configuration, router, store, post-inference worker, counters."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from engine.metrics import Metrics
from engine.models.router import Router, simulator_router
from engine.pipeline import StageStats
from engine.post import PostInference
from engine.store import InMemoryStore, ResponseStore
from engine.tokens import encoding


@dataclass
class EngineConfig:
    """Limits and defaults (SPEC: LIM-1..LIM-8)."""

    tokens_per_second: float = 1000.0
    max_connection_age_s: float = 3600.0
    suspended_idle_timeout_s: float = 600.0
    max_queued_creates: int = 16
    max_lanes: int = 32
    max_input_items: int = 10_000
    max_input_chars: int = 8_000_000  # text the model would read, per request (LIM-15)
    store_max_entries: int = 10_000
    post_queue_size: int = 4096
    ledger_path: Path | None = None
    default_model: str = "sim"
    model_timeout_s: float = 600.0  # one sampling step; over -> response.failed (LIM-7)
    safety_policy: str = "flag"  # "flag" records findings; "redact" also masks secrets (SAFE-3)


@dataclass
class Engine:
    config: EngineConfig = field(default_factory=EngineConfig)
    router: Router | None = None
    store: ResponseStore | None = None
    stats: StageStats = field(default_factory=StageStats)
    counters: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        if self.router is None:
            self.router = simulator_router(self.config.tokens_per_second)
        if self.store is None:
            self.store = InMemoryStore(self.config.store_max_entries)
        self.metrics = Metrics(self.counters)
        self.post = PostInference(
            self.metrics, self.config.post_queue_size, self.config.ledger_path
        )

    async def start(self) -> None:
        # Load the BPE vocabulary now, not inside the first request (it takes ~0.3 s).
        await asyncio.to_thread(encoding)
        await self.post.start()

    async def stop(self) -> None:
        await self.post.stop()
        await self.routes.aclose()  # the upstream HTTP pool, if any route has one

    @property
    def routes(self) -> Router:
        assert self.router is not None
        return self.router

    @property
    def responses(self) -> ResponseStore:
        assert self.store is not None
        return self.store
