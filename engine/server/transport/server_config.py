"""Transport-level settings (SPEC: LIM-9..LIM-14, AUTH-1..AUTH-3, TLS-1)."""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from engine.server.transport.turn_state import check_node_id
from engine.settings import duration, setting, url
from engine.store.ratelimits import Limits

log = logging.getLogger("rollout.server")


@dataclass(frozen=True)
class ServerConfig:
    """Transport limits, each written once, with its ``rollout serve`` flag (CFG-6)."""

    max_frame_bytes: int = setting(
        32 * 1024 * 1024,
        "--max-frame-bytes",
        help="one WS message / one HTTP body (LIM-9)",
        group="limits",
        unit="bytes",
    )
    max_connections: int = setting(
        1024,
        "--max-connections",
        help="open WebSockets; over -> 503 before the upgrade (LIM-10)",
        group="limits",
    )
    max_connections_per_key: int = setting(
        512,
        "--max-connections-per-key",
        help="open WebSockets of one API key; over -> 429 before the upgrade (LIM-30; 0: off)",
        group="limits",
    )
    websocket_enabled: bool = setting(
        True,
        "--no-websocket",
        help="answer upgrades with 426; clients fall back to HTTP (WS-13)",
        group="network",
    )
    ws_deflate: bool = setting(
        True,
        "--no-ws-deflate",
        help="decline permessage-deflate on upgrades: saves its CPU per turn on a LAN (CODEX-25)",
        group="network",
    )
    api_keys: frozenset[str] = field(default_factory=frozenset)  # empty = no auth (AUTH-1)
    send_timeout_s: float = setting(
        30.0,
        "--send-timeout",
        help="a reader this slow is disconnected (LIM-12)",
        group="limits",
        unit="s",
    )
    shutdown_grace_s: float = setting(
        10.0,
        "--shutdown-grace",
        help="in-flight responses may finish this long (LIM-13)",
        group="limits",
        unit="s",
    )
    node_id: str = setting(
        "",
        "--node-id",
        help="this node's name in x-codex-turn-state (TURN-1; empty: the host name)",
        group="network",
        parse=lambda text: check_node_id(text) if text else "",
    )
    idempotency_ttl_s: float = setting(
        24 * 3600.0,
        "--idempotency-ttl",
        help="an Idempotency-Key answers repeats this long (IDEM-3)",
        group="limits",
        unit="s",
    )
    idempotency_max_answer_bytes: int = 16 * 1024 * 1024  # one kept answer (IDEM-6)
    advertise_url: str = setting(
        "",
        "--advertise-url",
        help="this node's base URL for its peers' hand-overs (PARK-20; empty: http://HOST:PORT)",
        group="network",
        parse=url,
    )
    max_inspector_viewers: int = 16  # open /inspect/feed sockets; over -> 503 (LIM-23)
    # The inspector's sign-in sessions (AUTH-14): a session lasts this long after sign-in,
    # and a process keeps at most this many (the oldest sign-in goes first).
    inspector_session_ttl_s: float = setting(
        8 * 3600.0,
        "--inspector-session-ttl",
        help="an inspector sign-in lasts this long: seconds or 90s/45m/12h (AUTH-14)",
        group="limits",
        unit="s",
        parse=duration,
        metavar="AGE",
    )
    max_inspector_sessions: int = 1024  # one session is a digest, a key reference, a float
    # After the stop signal, /healthz fails but the node keeps serving this long, so a balancer
    # takes it out of rotation before it stops listening (DRAIN-2)
    drain_delay_s: float = setting(
        0.0,
        "--drain-delay",
        help="after SIGTERM, fail /healthz but keep serving this long before draining (DRAIN-2)",
        group="limits",
        unit="s",
    )

    # Operator keys (AUTH-4): valid everywhere a key is; they also see every key's rollouts on
    # the inspector (INSP-9) and may delete any key's record (OWN-5).
    admin_keys: frozenset[str] = field(default_factory=frozenset)

    # Rate limits (RATE-1): server-wide defaults, each overridden per key by the keys file;
    # None (or 0) is no limit.
    rate_requests: int | None = setting(
        None, "--rate-requests", help="responses a key may start per window (RATE-1)",
        group="limits", parse=int,
    )  # fmt: skip
    rate_tokens: int | None = setting(
        None, "--rate-tokens", help="tokens (input + output) per key and window (RATE-1)",
        group="limits", parse=int,
    )  # fmt: skip
    rate_concurrent: int | None = setting(
        None, "--rate-concurrent", help="responses in progress per key (RATE-1)",
        group="limits", parse=int,
    )  # fmt: skip
    rate_window_s: float = setting(
        60.0, "--rate-window", help="the rate limits' window (RATE-1)", group="limits", unit="s"
    )
    # key -> its own limits from the keys file ("KEY requests=N tokens=N concurrent=N", RATE-1)
    key_limits: Mapping[str, Mapping[str, int]] = field(default_factory=dict)

    @property
    def rate_limited(self) -> bool:
        """Any limit configured, by default or for some key: only then is anything counted."""
        return bool(self.rate_requests or self.rate_tokens or self.rate_concurrent) or any(
            any(own.values()) for own in self.key_limits.values()
        )

    def limits_for(self, key: str | None) -> Limits:
        """A key's limits: each one its own line names, else the server's default (RATE-1)."""
        own = self.key_limits.get(key, {}) if key is not None else {}
        return Limits(
            requests=own.get("requests", self.rate_requests or 0),
            tokens=own.get("tokens", self.rate_tokens or 0),
            concurrent=own.get("concurrent", self.rate_concurrent or 0),
        )

    @property
    def keyed(self) -> bool:
        """Any key configured: every route but ``/healthz`` needs one (AUTH-1)."""
        return bool(self.api_keys or self.admin_keys)

    def key_allowed(self, presented: str) -> bool:
        """Constant-time over every configured key: timing reveals neither key nor match."""
        return _matches(self.api_keys | self.admin_keys, presented)

    def is_admin(self, presented: str) -> bool:
        return _matches(self.admin_keys, presented)


def _matches(keys: frozenset[str], presented: str) -> bool:
    ok = False
    for key in keys:
        ok |= hmac.compare_digest(key.encode(), presented.encode())
    return ok


def load_api_keys(path: Path | None, env_var: str | None) -> frozenset[str]:
    """Keys from a file (one per line, '#' comments; a key may be followed by its limits,
    ``load_key_limits``) and/or an environment variable (comma-separated)."""
    keys: set[str] = set()
    if path is not None:
        for line in _key_lines(path):
            keys.add(line.split()[0])
    if env_var:
        keys.update(k.strip() for k in os.environ.get(env_var, "").split(",") if k.strip())
    return frozenset(keys)


LIMIT_NAMES = ("requests", "tokens", "concurrent")


def load_key_limits(path: Path | None) -> dict[str, dict[str, int]]:
    """Per-key limits from a keys file (RATE-1): ``KEY requests=60 tokens=40000 concurrent=4``;
    a limit a line does not name is the server's default. Raises ``ValueError`` naming the line
    (never the key) for anything else."""
    limits: dict[str, dict[str, int]] = {}
    if path is None:
        return limits
    for number, line in enumerate(_key_lines(path), 1):
        key, *fields = line.split()
        own: dict[str, int] = {}
        for text in fields:
            name, _, value = text.partition("=")
            if name not in LIMIT_NAMES or not value.isdigit():
                raise ValueError(
                    f"{path}: key line {number}: expected requests=N, tokens=N or concurrent=N"
                )
            own[name] = int(value)
        if own:
            limits[key] = own
    return limits


def _key_lines(path: Path) -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in path.read_text("utf-8").splitlines())
    return [line for line in lines if line]


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def refuse_if_open(config: ServerConfig, host: str, allow_anonymous: bool) -> str | None:
    """AUTH-10: a node reachable from elsewhere does not start without keys, unless told to
    with ``--allow-anonymous``; the reason it refuses, or None."""
    if config.keyed or is_loopback(host):
        return None
    if not allow_anonymous:
        return (
            f"refusing to listen on {host} without API keys: anyone who can reach it could use "
            "it and read every stored response. Set ROLLOUT_API_KEYS (or --api-keys-file), "
            "or pass --allow-anonymous."
        )
    log.warning(
        "no API key configured and listening on %s (--allow-anonymous): anyone who can reach it "
        "can use it",
        host,
    )
    return None
