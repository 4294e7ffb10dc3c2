"""Per-key rate limits and quotas (SPEC: RATE-1..RATE-8): what one key may start, checked once,
where every create is admitted (``connection/compat.py``'s ``run_create``), for HTTP, SSE,
background and WebSocket creates alike.

The server layer builds one ``Quota`` per request or connection (which key, which limits); the
counts live in the store (``engine/store/ratelimits.py``), so they hold across nodes on Redis.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from engine.store import ResponseStore, StoreError
from engine.store.ratelimits import Limits, Standing
from protocol.ratelimits import RateLimitExceeded, RateLimitSnapshot
from protocol.stream import new_id

log = logging.getLogger("rollout.ratelimit")
CONCURRENT_RETRY_S = 1.0  # a concurrency refusal has no window: try again this soon (RATE-5)
OPEN_BUCKET = "open"  # an open server (no keys): everyone shares the defaults (RATE-1)
Refused = Callable[[RateLimitSnapshot], Awaitable[None]]


@dataclass
class Quota:
    """One key's limits on one request or connection. ``last`` is the latest standing seen
    (for the headers every answer carries, RATE-3); ``on_refused`` lets the transport say more
    before the 429 error (Codex's ``codex.rate_limits`` event on its WebSocket, RATE-6)."""

    store: ResponseStore
    bucket: str  # the key's owner digest: counters never name a key (RATE-7)
    limits: Limits
    window_s: float
    last: RateLimitSnapshot | None = None
    on_refused: Refused | None = None
    refusals: int = field(default=0)

    def snapshot(self, standing: Standing) -> RateLimitSnapshot:
        limits = self.limits
        return RateLimitSnapshot(
            limit_requests=limits.requests,
            remaining_requests=limits.requests - standing.requests,
            limit_tokens=limits.tokens,
            remaining_tokens=limits.tokens - standing.tokens,
            reset_s=standing.reset_s,
            window_s=self.window_s,
            limit_concurrent=limits.concurrent,
            active=standing.active,
        )

    async def admit(self) -> str | None:
        """Count one create against the key's limits; returns its lease (give it back with
        ``settle``), or raises ``RateLimitExceeded``. A store that cannot count admits: the
        limits are a fairness measure, not a reason to stop serving (RATE-7)."""
        lease = new_id("lease")
        try:
            standing = await self.store.cluster.limits.admit(
                self.bucket, self.limits, self.window_s, lease
            )
        except StoreError as exc:
            log.warning("rate limits not counted: the store is unavailable (%s)", exc)
            return None
        self.last = self.snapshot(standing)
        if not standing.refused:
            return lease
        self.refusals += 1
        retry = CONCURRENT_RETRY_S if standing.refused == "concurrent" else standing.reset_s
        if self.on_refused is not None:
            await self.on_refused(self.last)
        raise RateLimitExceeded(standing.refused, self.last, retry)

    async def settle(self, lease: str | None, tokens: int) -> None:
        """The response ended: its tokens count in the window, its lease is given back."""
        if lease is None:
            return
        try:
            await self.store.cluster.limits.settle(self.bucket, self.window_s, tokens, lease)
        except StoreError as exc:
            log.warning("rate limits not settled: the store is unavailable (%s)", exc)

    async def current(self) -> RateLimitSnapshot | None:
        """The standing now, for an answer that admitted nothing (RATE-3); None when the store
        cannot say."""
        try:
            standing = await self.store.cluster.limits.peek(self.bucket, self.window_s)
        except StoreError:
            return None
        return self.snapshot(standing)
