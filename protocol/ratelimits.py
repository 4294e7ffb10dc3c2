"""Rate-limit figures in the shapes Codex reads (SPEC: CODEX-26).

The per-key limiter owns the figures; this module only shapes them, so that every place that
reports them (a WebSocket event, HTTP headers, a 429's headers) says the same thing:

* ``codex.rate_limits``, a WebSocket event Codex reads between a response's events
  (codex-rs/codex-api/src/rate_limits.rs ``parse_rate_limit_event``);
* the ``x-codex-primary-*`` / ``x-codex-secondary-*`` headers Codex reads from a 101 or an HTTP
  answer (same file, ``parse_rate_limit_for_limit``).

Only Codex reads either: the openai SDK has no ``codex.rate_limits`` event, so the event goes
only to connections that identified themselves as Codex (CONF-1).
"""

from __future__ import annotations

import msgspec


class RateLimitWindow(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One window of one limit: how much of it is used, how long it is, when it resets."""

    used_percent: float  # 0..100
    window_minutes: int | None = None
    reset_at: int | None = None  # Unix seconds


class RateLimitSnapshot(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A key's limits at one moment: the primary window (e.g. requests per minute) and an
    optional secondary one (e.g. tokens per minute)."""

    primary: RateLimitWindow | None = None
    secondary: RateLimitWindow | None = None


class CodexRateLimits(
    msgspec.Struct, tag="codex.rate_limits", tag_field="type", kw_only=True, omit_defaults=True
):
    rate_limits: RateLimitSnapshot
    metered_limit_name: str | None = None


_ENCODE = msgspec.json.Encoder().encode


def codex_rate_limits_event(snapshot: RateLimitSnapshot, limit_name: str | None = None) -> bytes:
    """The ``codex.rate_limits`` frame for ``snapshot`` (``limit_name``: Codex's limit id; it
    defaults to ``codex`` when absent)."""
    return _ENCODE(CodexRateLimits(rate_limits=snapshot, metered_limit_name=limit_name))


def codex_rate_limit_headers(snapshot: RateLimitSnapshot) -> dict[str, str]:
    """The same figures as Codex's ``x-codex-*`` headers (its default ``codex`` limit family)."""
    headers: dict[str, str] = {}
    for name, window in (("primary", snapshot.primary), ("secondary", snapshot.secondary)):
        if window is None:
            continue
        headers[f"x-codex-{name}-used-percent"] = f"{window.used_percent:g}"
        if window.window_minutes is not None:
            headers[f"x-codex-{name}-window-minutes"] = str(window.window_minutes)
        if window.reset_at is not None:
            headers[f"x-codex-{name}-reset-at"] = str(window.reset_at)
    return headers
