"""Transport-level settings (SPEC: LIM-9..LIM-14, AUTH-1..AUTH-3, TLS-1)."""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from engine.server.turn_state import default_node_id

log = logging.getLogger("rollout.server")
LOOPBACK = ("127.0.0.1", "::1", "localhost")


@dataclass(frozen=True)
class ServerConfig:
    max_frame_bytes: int = 32 * 1024 * 1024  # one WS message / one HTTP body (LIM-9)
    max_connections: int = 1024  # open WebSockets; over -> 503 before the upgrade (LIM-10)
    websocket_enabled: bool = True  # False -> 426 on upgrade, clients fall back to HTTP (WS-13)
    api_keys: frozenset[str] = field(default_factory=frozenset)  # empty = no auth (AUTH-1)
    send_timeout_s: float = 30.0  # a reader this slow is disconnected (LIM-12)
    shutdown_grace_s: float = 10.0  # in-flight responses may finish this long (LIM-13)
    node_id: str = field(default_factory=default_node_id)  # named in x-codex-turn-state (TURN-1)
    max_inspector_viewers: int = 16  # open /inspect/feed sockets; over -> 503 (LIM-23)
    # After the stop signal, /healthz fails but the node keeps serving this long, so a balancer
    # takes it out of rotation before it stops listening (DRAIN-2)
    drain_delay_s: float = 0.0

    def key_allowed(self, presented: str) -> bool:
        """Constant-time over every configured key: timing reveals neither key nor match."""
        ok = False
        for key in self.api_keys:
            ok |= hmac.compare_digest(key.encode(), presented.encode())
        return ok

    def owner_of(self, authorization: str) -> str | None:
        """The identity that owns what a request creates (OWN-1): a digest of its API key (the
        key itself is never stored), or None on an open server, where everything is shared.
        Called after the auth middleware accepted the key."""
        if not self.api_keys:
            return None
        _, _, presented = authorization.partition(" ")
        return hashlib.sha256(presented.strip().encode()).hexdigest()[:32]


def load_api_keys(path: Path | None, env_var: str | None) -> frozenset[str]:
    """Keys from a file (one per line, '#' comments) and/or an environment variable
    (comma-separated)."""
    keys: set[str] = set()
    if path is not None:
        for line in path.read_text(encoding="utf-8").splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                keys.add(line)
    if env_var:
        keys.update(k.strip() for k in os.environ.get(env_var, "").split(",") if k.strip())
    return frozenset(keys)


def warn_if_open(config: ServerConfig, host: str) -> None:
    if not config.api_keys and host not in LOOPBACK:
        log.warning(
            "no API key configured and listening on %s: anyone who can reach it can use it", host
        )
