"""The process-wide engine: configuration, router, store, post-inference worker, counters."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from engine.conversation.pipeline import StageStats
from engine.conversation.sealed import KeyRing
from engine.conversation.tokens import encoding
from engine.hosted.policy import HostPolicy, McpLimits, allow_hosts
from engine.models.router import Router, simulator_router
from engine.observe.benchclock import BenchClock
from engine.observe.metrics import Metrics
from engine.observe.postinference import PostInference
from engine.observe.tracing import Tracing
from engine.retained.budget import MemoryBudget
from engine.retained.handover import Handover
from engine.retained.hydration import HydrationCache
from engine.retained.leases import RunLeases
from engine.retained.parking import ParkingBounds, ParkingLot
from engine.retained.shared_resends import SharedResends
from engine.settings import duration, setting, url
from engine.store import (
    DEFAULT_MAX_ENTRIES,
    DEFAULT_TTL_S,
    MemoryStore,
    ResponseRecord,
    ResponseStore,
    StoreError,
)
from protocol.codec import RecentTools

log = logging.getLogger("rollout.engine")


LIMITS, ENGINE = "limits", "engine"


@dataclass(frozen=True)
class EngineConfig:
    """Limits and defaults (SPEC: LIM-1..LIM-8), each written once, with its flag (CFG-6)."""

    tokens_per_second: float = setting(
        1000.0, "--tps", help="simulated model speed (0: no pacing)", group=ENGINE, unit="tokens/s"
    )
    max_connection_age_s: float = setting(
        3600.0, "--max-connection-age", help="age of a WebSocket (LIM-1)", group=LIMITS, unit="s"
    )
    suspended_idle_timeout_s: float = setting(
        600.0, "--idle-timeout", help="suspended rollout (LIM-6)", group=LIMITS, unit="s"
    )
    max_queued_creates: int = setting(
        16, "--max-queued", help="queued creates per lane (LIM-2)", group=LIMITS
    )
    max_queued_bytes: int = setting(
        64 * 1024 * 1024,
        "--max-queued-bytes",
        help="create frames queued per connection (LIM-22)",
        group=LIMITS,
        unit="bytes",
    )
    max_lanes: int = setting(
        32, "--max-lanes", help="named stream_ids per connection (LIM-3)", group=LIMITS
    )
    max_input_items: int = setting(
        10_000, "--max-input-items", help="items per request (LIM-4)", group=LIMITS
    )
    max_input_chars: int = setting(
        8_000_000,
        "--max-input-chars",
        help="text the model would read, per request (LIM-15)",
        group=LIMITS,
        unit="characters",
    )
    store_max_entries: int = setting(
        DEFAULT_MAX_ENTRIES,
        "--store-max-entries",
        help="stored responses (memory:// only, LIM-5)",
        group=LIMITS,
    )
    store_ttl_s: float = setting(
        DEFAULT_TTL_S,
        "--store-ttl",
        help="retention of stored responses: seconds or 90s/45m/12h/30d; 0 = forever (STORE-7)",
        group="store",
        unit="s",
        parse=duration,
        metavar="AGE",
    )
    post_queue_size: int = 4096  # post-inference records waiting (LIM-8)
    ledger_path: Path | None = setting(
        None, "--ledger", help="append usage records (JSONL)", group=ENGINE, parse=Path
    )
    # Set from the routing config (CFG-4) when the router is built, before this config is.
    default_model: str = "sim"
    model_timeout_s: float = setting(
        600.0, "--model-timeout", help="one sampling step (LIM-7)", group=LIMITS, unit="s"
    )
    # Background responses (BG-*): live runs at once, each run's replayable event log, and the
    # age after which an unfinished stored background response no live run owns is orphaned
    # (longer than any run can last: one sampling step, LIM-7).
    max_background_runs: int = 1024
    background_log_bytes: int = 8 * 1024 * 1024
    background_orphan_after_s: float = 900.0
    safety_policy: str = setting(
        "flag",
        "--safety-policy",
        help="flag records findings; redact also masks secrets (SAFE-3)",
        group=ENGINE,
        choices=("flag", "redact"),
    )
    full_echo: bool = setting(
        False,
        "--full-echo",
        help="response.created and response.in_progress echo the request's instructions and "
        "tools, as OpenAI does (RESP-5; off: only the terminal event carries them)",
        group=ENGINE,
    )
    bench_timings: bool = setting(
        False,
        "--bench-timings",
        help="record per-turn stage timings, served at GET /v1/bench/timings (OBS-5, benchmark)",
        group="models",
    )
    otel_endpoint: str | None = setting(
        None,
        "--otel-endpoint",
        help="OTLP/HTTP collector base URL (http://host:4318): export traces (OTEL-1; off)",
        group=ENGINE,
        metavar="URL",
        parse=url,
    )
    memory_budget: int = setting(
        1024 * 1024 * 1024,
        "--memory-budget",
        help="what the hydration cache, parked rollouts and background event logs hold together, "
        "measured as real bytes (MEM-12)",
        group=LIMITS,
        unit="bytes",
    )
    # None: its share of the memory budget (MEM-12)
    hydration_cache_bytes: int | None = setting(
        None,
        "--hydration-cache-bytes",
        help="per-process cache of recent stored contexts (HYD-2, LIM-21; 0: off; "
        "default: half of --memory-budget)",
        group=LIMITS,
        parse=int,
    )
    reasoning_key_file: Path | None = setting(
        None,
        "--reasoning-key-file",
        help="keys that seal reasoning.encrypted_content, one a line (64 hex digits or base64 "
        "of 32 bytes): the first seals, all open; every node of a cluster names the same file "
        "(SEAL-5; default: a random per-process key, blobs lost on restart)",
        group=ENGINE,
        parse=Path,
        metavar="FILE",
    )
    park_seconds: float = setting(
        60.0,
        "--park-seconds",
        help="a suspended rollout outlives its closed WebSocket or HTTP create this long "
        "(PARK-1, PARK-4; 0: off)",
        group=LIMITS,
        unit="s",
    )
    # count and bytes, per owner and per process (PARK-7); None: the budget's share (MEM-12)
    park_bounds: ParkingBounds | None = None
    # Remote MCP tools (SPEC §18): one call's time, its output's size, reachable private hosts.
    mcp_call_timeout_s: float = setting(
        30.0,
        "--mcp-call-timeout",
        help="one remote MCP list or call, connecting included (MCP-8, LIM-40)",
        group=LIMITS,
        unit="s",
    )
    mcp_max_output_bytes: int = setting(
        1024 * 1024,
        "--mcp-max-output",
        help="one remote MCP call's output (MCP-13, LIM-41)",
        group=LIMITS,
        unit="bytes",
    )
    mcp_max_calls: int = setting(
        32,
        "--mcp-max-calls",
        help="remote MCP calls the model may make in one response (MCP-14, LIM-42)",
        group=LIMITS,
    )
    mcp_allow_hosts: str = setting(
        "",
        "--mcp-allow-hosts",
        help="comma-separated host names, addresses or networks an mcp tool's server_url may "
        "reach although they are loopback, link-local or private (MCP-10; default: none)",
        group=ENGINE,
        metavar="HOSTS",
        parse=allow_hosts,
    )

    @property
    def mcp_limits(self) -> McpLimits:
        return McpLimits(
            self.mcp_call_timeout_s,
            self.mcp_max_output_bytes,
            HostPolicy.parse(self.mcp_allow_hosts),
        )

    @property
    def budget(self) -> MemoryBudget:
        """The memory budget's split (MEM-12); an explicit bound wins over its share."""
        return MemoryBudget.split(self.memory_budget, self.hydration_cache_bytes, self.park_bounds)


class Engine:
    """One per process: each part has one name. ``router`` maps model names to backends,
    ``store`` keeps ``store=true`` responses; both default to the embedded ones."""

    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        router: Router | None = None,
        store: ResponseStore | None = None,
    ) -> None:
        self.config = config if config is not None else EngineConfig()
        tokens_per_second = self.config.tokens_per_second
        self.router = router if router is not None else simulator_router(tokens_per_second)
        self.store = store if store is not None else self._memory_store()
        self.stats = StageStats()
        self.counters: Counter[str] = Counter()  # create paths and cache events, for /metrics
        self.store.count_into(self.counters)  # and the store's (store.*, OBS-2)
        for backend in self.router.backends():  # and the token routes' (PARSE-3, TOK-33)
            backend.count_into(self.counters)
        self.metrics = Metrics(self.counters)
        budget = self.config.budget
        self.hydrated = HydrationCache(budget.hydration, self.counters)
        self.tools = RecentTools()  # CACHE-7: HTTP creates' checked tools, by their bytes
        # PARK-20..PARK-22: where parked rollouts are, for a node that is asked to continue one
        self.handover = Handover(self.store, self.counters, self.config.park_seconds)
        # COMPAT-10: stored responses by (owner, item list), for a resend on another node
        self.resends = SharedResends(self.store, self.handover, self.counters)
        self.leases = RunLeases(self.handover)  # LIVE-1: where each background run lives
        self.parking = ParkingLot(
            self.config.park_seconds, self.counters, budget.parking, self.handover
        )
        self._event_sync: asyncio.Task[None] | None = None
        self.store.cluster.on_delete(self._forget)
        self.store.cluster.on_continued(self.parking.continued_elsewhere)  # PARK-9
        self.post = PostInference(
            self.metrics, self.config.post_queue_size, self.config.ledger_path
        )
        self.mcp_limits = self.config.mcp_limits  # parsed once (MCP-10)
        self.bench_clock = BenchClock() if self.config.bench_timings else None
        # Seals and opens reasoning.encrypted_content (SEAL-5): one ring per process.
        self.reasoning_keys = KeyRing.from_file(self.config.reasoning_key_file)
        if self.bench_clock is not None:
            self.post.on_accounted = self.bench_clock.post
        self._writes: set[asyncio.Task[None]] = set()  # best-effort writes (cancelled turns)
        # OpenTelemetry (OTEL-1): None when off, and then nothing of it runs (OTEL-6).
        endpoint = self.config.otel_endpoint
        self.tracing: Tracing | None = Tracing(endpoint) if endpoint else None

    def _memory_store(self) -> ResponseStore:
        config = self.config
        return MemoryStore(
            config.store_max_entries, config.store_ttl_s, max_bytes=config.budget.store
        )

    async def start(self) -> None:
        # Load the BPE vocabulary now, not inside the first request (it takes ~0.3 s).
        await asyncio.to_thread(encoding)
        await self.store.open()
        await self.post.start()
        if self.metrics.shared_dir:  # one of several workers (WORK-3)
            self._event_sync = asyncio.create_task(self.metrics.sync_forever(), name="metrics")

    async def stop(self) -> None:
        await self.parking.close()  # parked rollouts finish (and account) before the worker stops
        await self.handover.close()
        await self.post.stop()
        self.metrics.sync_events()  # what the last records counted reaches the shared files
        if self._event_sync is not None:
            self._event_sync.cancel()
            await asyncio.gather(self._event_sync, return_exceptions=True)
        if self.tracing is not None:  # the last spans leave (the exporter blocks: a thread)
            await asyncio.to_thread(self.tracing.shutdown)
            self.metrics.sync_events()
        if self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)
        await self.store.close()
        await self.router.aclose()  # the upstream HTTP pool, if any route has one

    async def flush_writes(self) -> None:
        """Wait for the background writes queued so far (a cancel answers only once its
        cancelled record is stored, BG-6, BG-9)."""
        if self._writes:
            await asyncio.gather(*list(self._writes), return_exceptions=True)

    def store_later(self, record: ResponseRecord) -> None:
        """Write a record nobody waits for (a cancelled response, STORE-2): owned, best effort."""
        task = asyncio.create_task(self._store_quietly(record), name=f"store {record.id}")
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _store_quietly(self, record: ResponseRecord) -> None:
        try:
            await self.store.put(record)
        except StoreError as exc:
            log.warning("store: cancelled response %s not stored: %s", record.id, exc)

    async def announce_continued(self, response_id: str) -> None:
        """A stored response was just continued from the store here: every process sharing the
        store retires a rollout it still parks behind it (PARK-9). Best effort: the store just
        answered the read, and a notice it drops costs only a parked copy until its expiry."""
        try:
            await self.store.cluster.announce_continued(response_id)
        except StoreError as exc:
            self.counters["park.notice_failed"] += 1
            log.warning("store: continued notice for %s not sent: %s", response_id, exc)
        else:
            self.counters["park.notice_sent"] += 1

    def _forget(self, response_id: str) -> None:
        """A deleted response leaves this process's caches too: hydration, parking (HYD-5)."""
        self.hydrated.discard(response_id)
        self.parking.discard(response_id)
