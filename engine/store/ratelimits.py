"""Rate-limit counters in the shared store, so a key's limits hold across nodes (SPEC: RATE-7).

Fixed windows: a key's requests and tokens count from the start of the current window (aligned
to the store's clock, so every node agrees) until it ends. Concurrency is a set of leases, one
per response in progress, each with an expiry, so a node that dies without releasing its
leases stops holding them after ``LEASE_S``.

Two implementations behind one interface: ``LocalCounters`` (this process: the memory and
SQLite stores, one node) and ``RedisCounters`` (one Lua script per operation: the check and the
increment are one atomic step on the server, one round trip). Postgres uses the local counters
(documented in RATE-7).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

LEASE_S = 3600.0  # a response in progress longer than this stops counting as concurrent
MAX_LOCAL_BUCKETS = 100_000  # bounded: buckets are API keys (or one, on an open server)
KEY_PREFIX = "rollout:ratelimit:"


@dataclass(frozen=True)
class Limits:
    """One key's limits; 0 = no limit (RATE-1)."""

    requests: int = 0  # responses started per window
    tokens: int = 0  # input + output tokens per window
    concurrent: int = 0  # responses in progress at once

    @property
    def any(self) -> bool:
        return bool(self.requests or self.tokens or self.concurrent)


@dataclass(frozen=True)
class Standing:
    """A key's counts in the current window; ``refused`` names the limit an admission hit
    (``requests``, ``tokens``, ``concurrent``) or is empty when it was admitted."""

    requests: int
    tokens: int
    active: int
    reset_s: float
    refused: str = ""


VERDICTS = ("", "requests", "tokens", "concurrent")


class LocalCounters:
    """One process's counters (memory and SQLite stores: one node, RATE-7)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._windows: dict[str, list[float]] = {}  # bucket -> [start, requests, tokens]
        self._active: dict[str, dict[str, float]] = {}  # bucket -> lease -> expiry

    def _window(self, bucket: str, window_s: float) -> tuple[list[float], float]:
        now = self._clock()
        start = now - now % window_s
        counts = self._windows.get(bucket)
        if counts is None or counts[0] != start:
            if len(self._windows) >= MAX_LOCAL_BUCKETS:
                self._windows.clear()  # a new window for everyone: never over the bound
            counts = self._windows[bucket] = [start, 0, 0]
        return counts, start + window_s - now

    def _leases(self, bucket: str) -> dict[str, float]:
        now = self._clock()
        leases = self._active.get(bucket, {})
        for lease in [lease for lease, until in leases.items() if until <= now]:
            del leases[lease]
        return leases

    async def admit(self, bucket: str, limits: Limits, window_s: float, lease: str) -> Standing:
        counts, reset = self._window(bucket, window_s)
        leases = self._leases(bucket)
        verdict = _verdict(limits, int(counts[1]), int(counts[2]), len(leases))
        if not verdict:
            counts[1] += 1
            if limits.concurrent:
                if len(self._active) >= MAX_LOCAL_BUCKETS:
                    self._active.clear()
                self._active.setdefault(bucket, leases)[lease] = self._clock() + LEASE_S
        return Standing(int(counts[1]), int(counts[2]), len(leases), reset, verdict)

    async def settle(self, bucket: str, window_s: float, tokens: int, lease: str) -> None:
        counts, _ = self._window(bucket, window_s)
        counts[2] += tokens
        self._active.get(bucket, {}).pop(lease, None)

    async def peek(self, bucket: str, window_s: float) -> Standing:
        counts, reset = self._window(bucket, window_s)
        return Standing(int(counts[1]), int(counts[2]), len(self._leases(bucket)), reset)


def _verdict(limits: Limits, requests: int, tokens: int, active: int) -> str:
    if limits.requests and requests + 1 > limits.requests:
        return "requests"
    if limits.tokens and tokens >= limits.tokens:
        return "tokens"
    if limits.concurrent and active >= limits.concurrent:
        return "concurrent"
    return ""


# KEYS: the window hash, the lease set. ARGV: window ms, request limit, token limit,
# concurrency limit, lease id, lease ms, "admit" | "peek". The same checks as ``_verdict``.
_ADMIT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local w = tonumber(ARGV[1])
local start = now - (now % w)
local h = redis.call('HMGET', KEYS[1], 's', 'r', 't')
local req, tok = 0, 0
if tonumber(h[1]) == start then req = tonumber(h[2]) or 0; tok = tonumber(h[3]) or 0 end
local rlim, tlim, clim = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local active = redis.call('ZCARD', KEYS[2])
local verdict = 0
if ARGV[7] == 'admit' then
  if rlim > 0 and req + 1 > rlim then verdict = 1
  elseif tlim > 0 and tok >= tlim then verdict = 2
  elseif clim > 0 and active >= clim then verdict = 3
  else
    req = req + 1
    redis.call('HSET', KEYS[1], 's', start, 'r', req, 't', tok)
    redis.call('PEXPIRE', KEYS[1], w * 2)
    if clim > 0 then
      redis.call('ZADD', KEYS[2], now + tonumber(ARGV[6]), ARGV[5])
      redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[6]))
      active = active + 1
    end
  end
end
return {verdict, req, tok, active, start + w - now}
"""

# KEYS: the window hash, the lease set. ARGV: window ms, tokens, lease id.
_SETTLE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local w = tonumber(ARGV[1])
local start = now - (now % w)
local tokens = tonumber(ARGV[2])
if tokens > 0 then
  if tonumber(redis.call('HGET', KEYS[1], 's')) == start then
    redis.call('HINCRBY', KEYS[1], 't', tokens)
  else
    redis.call('HSET', KEYS[1], 's', start, 'r', 0, 't', tokens)
  end
  redis.call('PEXPIRE', KEYS[1], w * 2)
end
redis.call('ZREM', KEYS[2], ARGV[3])
return 0
"""

Call = Callable[[Callable[[Any], Awaitable[Any]]], Awaitable[Any]]


class RedisCounters:
    """The counters in Redis (RATE-7): every node of a cluster counts in the same hash. ``call``
    is the store's own (its client, its errors: a Redis that is down is ``StoreUnavailable``)."""

    def __init__(self, call: Call) -> None:
        self._call = call
        self._scripts: dict[str, Any] = {}

    def _script(self, client: Any, lua: str) -> Any:
        script = self._scripts.get(lua)
        if script is None:  # registered once: later calls send only its SHA (EVALSHA)
            script = self._scripts[lua] = client.register_script(lua)
        return script

    async def _run(self, lua: str, bucket: str, args: list[Any]) -> Any:
        keys = [f"{KEY_PREFIX}{bucket}:w", f"{KEY_PREFIX}{bucket}:active"]

        async def op(client: Any) -> Any:
            return await self._script(client, lua)(keys=keys, args=args)

        return await self._call(op)

    async def admit(self, bucket: str, limits: Limits, window_s: float, lease: str) -> Standing:
        return await self._standing(bucket, limits, window_s, lease, "admit")

    async def peek(self, bucket: str, window_s: float) -> Standing:
        return await self._standing(bucket, Limits(), window_s, "", "peek")

    async def _standing(
        self, bucket: str, limits: Limits, window_s: float, lease: str, mode: str
    ) -> Standing:
        window_ms = max(1, int(window_s * 1000))
        args = [window_ms, limits.requests, limits.tokens, limits.concurrent]
        reply = await self._run(_ADMIT, bucket, [*args, lease, int(LEASE_S * 1000), mode])
        verdict, requests, tokens, active, reset_ms = (int(x) for x in reply)
        return Standing(requests, tokens, active, reset_ms / 1000, VERDICTS[verdict])

    async def settle(self, bucket: str, window_s: float, tokens: int, lease: str) -> None:
        window_ms = max(1, int(window_s * 1000))
        await self._run(_SETTLE, bucket, [window_ms, tokens, lease])


Counters = LocalCounters | RedisCounters
