"""Per-key rate limits on the wire (SPEC: RATE-1..RATE-8): the figures, the headers
api.openai.com sends with them, the 429 error, and the ``codex.rate_limits`` event Codex reads.

Pure: the engine counts (``engine/retained/ratelimits.py``), this module only says how the counts
look to a client, so any part that answers a client (the HTTP routes, the WebSocket, Codex's
surface) builds the same headers and events from one snapshot.
"""

from __future__ import annotations

import math
import time
from typing import Any

import msgspec

from protocol.errors import TooManyRequests

RATE_LIMIT_CODE = "rate_limit_exceeded"


class RateLimitSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """One key's standing in the current window (RATE-2). A limit of 0 is no limit: its
    headers are left out. ``reset_s``: seconds until the window's counts start again."""

    limit_requests: int = 0
    remaining_requests: int = 0
    limit_tokens: int = 0
    remaining_tokens: int = 0
    reset_s: float = 0.0
    window_s: float = 60.0
    limit_concurrent: int = 0
    active: int = 0  # responses of this key in progress (RATE-4)

    def headers(self) -> dict[str, str]:
        """``x-ratelimit-*`` exactly as api.openai.com names them (RATE-3)."""
        out: dict[str, str] = {}
        reset = go_duration(self.reset_s)
        if self.limit_requests:
            out["x-ratelimit-limit-requests"] = str(self.limit_requests)
            out["x-ratelimit-remaining-requests"] = str(max(0, self.remaining_requests))
            out["x-ratelimit-reset-requests"] = reset
        if self.limit_tokens:
            out["x-ratelimit-limit-tokens"] = str(self.limit_tokens)
            out["x-ratelimit-remaining-tokens"] = str(max(0, self.remaining_tokens))
            out["x-ratelimit-reset-tokens"] = reset
        return out


def go_duration(seconds: float) -> str:
    """A reset time the way api.openai.com writes it (Go's ``time.Duration``): ``20ms``,
    ``1s``, ``8.64s``, ``6m0s``, ``1h2m3s`` (RATE-3)."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{max(1, round(seconds * 1000))}ms"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{secs:.3f}".rstrip("0").rstrip(".") + "s"
    if hours >= 1:
        return f"{int(hours)}h{int(minutes)}m{text}"
    if minutes >= 1:
        return f"{int(minutes)}m{text}"
    return text


class RateLimitExceeded(TooManyRequests):
    """429 ``rate_limit_exceeded`` (RATE-5): which limit, and the figures a client paces itself
    by, as headers on HTTP and in the WebSocket error event's ``headers`` (as Codex reads them,
    ``codex-api/src/endpoint/responses_websocket.rs``)."""

    def __init__(self, which: str, snapshot: RateLimitSnapshot, retry_after_s: float) -> None:
        super().__init__(RATE_LIMIT_CODE, _MESSAGES[which].format(s=snapshot), None)
        self.which = which
        self.snapshot = snapshot
        self.retry_after_s = retry_after_s
        self.headers = {
            **snapshot.headers(),
            # the openai SDK waits this long before its retry (``_base_client.py``)
            "retry-after": str(max(1, math.ceil(retry_after_s))),
            "retry-after-ms": str(max(1, math.ceil(retry_after_s * 1000))),
        }


_MESSAGES = {
    "requests": "Rate limit reached for requests per minute: limit {s.limit_requests}.",
    "tokens": "Rate limit reached for tokens per minute: limit {s.limit_tokens}.",
    "concurrent": "Too many concurrent responses for this key: limit {s.limit_concurrent}.",
}


class CodexRateLimits(msgspec.Struct, tag="codex.rate_limits", tag_field="type"):
    """``{"type": "codex.rate_limits", "rate_limits": {...}}`` (RATE-6)."""

    rate_limits: dict[str, Any]


def codex_rate_limits(snapshot: RateLimitSnapshot, *, now: float | None = None) -> CodexRateLimits:
    """The ``codex.rate_limits`` WebSocket event (RATE-6) as Codex parses it
    (``codex-api/src/rate_limits.rs``, ``parse_rate_limit_event``): the requests window as
    ``primary``, the tokens window as ``secondary``, each as percent used."""
    at = time.time() if now is None else now
    reset_at = int(at + snapshot.reset_s)
    windows: dict[str, Any] = {}
    figures = (
        ("primary", snapshot.limit_requests, snapshot.remaining_requests),
        ("secondary", snapshot.limit_tokens, snapshot.remaining_tokens),
    )
    reached = False
    for name, limit, remaining in figures:
        if not limit:
            continue
        used = min(100.0, 100.0 * (limit - max(0, remaining)) / limit)
        reached |= remaining <= 0
        windows[name] = {
            "used_percent": round(used, 2),
            "window_minutes": max(1, round(snapshot.window_s / 60)),
            "reset_after_seconds": max(0, math.ceil(snapshot.reset_s)),
            "reset_at": reset_at,
        }
    return CodexRateLimits({"allowed": not reached, "limit_reached": reached, **windows})
