"""The inspector's sign-in sessions (SPEC: AUTH-13, AUTH-14).

A browser that signs in at ``/inspect/login`` gets a random token in its cookie, never the API
key: the token maps, in this process only, to the key that signed in. A token expires
``ttl_s`` after sign-in, is revoked by sign-out, and the table holds at most ``max_sessions``
tokens (the oldest go first). Tokens are kept as their sha256, so the table holds no token a
browser could present, and a lookup is one dict probe on a digest.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable

TOKEN_BYTES = 32  # 256 random bits


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class SignIns:
    """Sign-in session tokens -> the key that signed in, expiring and bounded (AUTH-14)."""

    def __init__(
        self, ttl_s: float, max_sessions: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl_s = ttl_s
        self.max_sessions = max(1, max_sessions)
        self.clock = clock
        # digest -> (key, expires_at), in sign-in order: the first entry is the oldest
        self._table: dict[bytes, tuple[str, float]] = {}

    def __len__(self) -> int:
        return len(self._table)

    def open(self, key: str) -> str:
        """A new session for ``key``; its token goes to the browser, its digest stays here."""
        now = self.clock()
        self._drop_expired(now)
        while len(self._table) >= self.max_sessions:  # the bound: the oldest sign-in goes
            del self._table[next(iter(self._table))]
        token = secrets.token_urlsafe(TOKEN_BYTES)
        self._table[_digest(token)] = (key, now + self.ttl_s)
        return token

    def key_of(self, token: str) -> str | None:
        """The key a live session signed in with; None for an unknown, revoked or expired
        token (an expired one is forgotten)."""
        digest = _digest(token)
        entry = self._table.get(digest)
        if entry is None:
            return None
        key, expires_at = entry
        if self.clock() >= expires_at:
            del self._table[digest]
            return None
        return key

    def close(self, token: str) -> None:
        """Sign-out: the token names no session from now on."""
        self._table.pop(_digest(token), None)

    def _drop_expired(self, now: float) -> None:
        # Sign-in order is expiry order (one ttl for all), so the expired ones lead.
        while self._table:
            digest, (_, expires_at) = next(iter(self._table.items()))
            if expires_at > now:
                break
            del self._table[digest]
