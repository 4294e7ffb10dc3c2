"""CODEX-26: rate-limit figures in the two shapes Codex reads, read back the way Codex reads
them (codex-rs/codex-api/src/rate_limits.rs: ``parse_rate_limit_event`` takes `type`,
`rate_limits.primary/secondary.{used_percent, window_minutes, reset_at}` and
`metered_limit_name`; ``parse_rate_limit_for_limit`` takes `x-codex-{primary,secondary}-*`)."""

from __future__ import annotations

import msgspec

from protocol.ratelimits import (
    RateLimitSnapshot,
    RateLimitWindow,
    codex_rate_limit_headers,
    codex_rate_limits_event,
)


class _Window(msgspec.Struct):
    used_percent: float
    window_minutes: int | None = None
    reset_at: int | None = None


class _Details(msgspec.Struct):
    primary: _Window | None = None
    secondary: _Window | None = None


class _CodexEvent(msgspec.Struct, forbid_unknown_fields=True):
    """Codex's ``RateLimitEvent`` fields, and nothing else."""

    type: str
    rate_limits: _Details | None = None
    metered_limit_name: str | None = None
    plan_type: str | None = None
    credits: dict[str, object] | None = None
    limit_name: str | None = None


SNAPSHOT = RateLimitSnapshot(
    primary=RateLimitWindow(used_percent=42.5, window_minutes=1, reset_at=1_800_000_000),
    secondary=RateLimitWindow(used_percent=3.0, window_minutes=1),
)


def test_event_reads_back_as_codex_reads_it() -> None:
    event = msgspec.json.decode(codex_rate_limits_event(SNAPSHOT, "rollout"), type=_CodexEvent)
    assert event.type == "codex.rate_limits" and event.metered_limit_name == "rollout"
    assert event.rate_limits is not None and event.rate_limits.primary is not None
    assert event.rate_limits.primary == _Window(42.5, 1, 1_800_000_000)
    assert event.rate_limits.secondary == _Window(3.0, 1, None)
    bare = msgspec.json.decode(codex_rate_limits_event(RateLimitSnapshot()))
    assert bare == {"type": "codex.rate_limits", "rate_limits": {}}


def test_headers_carry_the_same_figures() -> None:
    assert codex_rate_limit_headers(SNAPSHOT) == {
        "x-codex-primary-used-percent": "42.5",
        "x-codex-primary-window-minutes": "1",
        "x-codex-primary-reset-at": "1800000000",
        "x-codex-secondary-used-percent": "3",
        "x-codex-secondary-window-minutes": "1",
    }
    assert codex_rate_limit_headers(RateLimitSnapshot()) == {}
