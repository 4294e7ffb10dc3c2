"""The response store (SPEC: STORE-1..STORE-20): one interface, four backends chosen by URL.

* ``sqlite:///PATH``  - embedded, durable, one process (the default of ``rollout serve``)
* ``redis://HOST:PORT/DB`` / ``rediss://…`` - shared by many processes and hosts
* ``postgresql://USER@HOST:PORT/DB`` / ``postgres://…`` - shared, on the operator's Postgres
* ``memory://``       - this process only, for tests and throwaway runs
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from engine.store.cluster_state import ClusterState, DeleteListener
from engine.store.listing import listing_form
from engine.store.memory import DEFAULT_MAX_BYTES, MemoryStore
from engine.store.records import (
    DEFAULT_MAX_ENTRIES,
    DEFAULT_MAX_RECORD_BYTES,
    DEFAULT_TTL_S,
    SNAPSHOT_EVERY,
    ChainPoint,
    Hydrated,
    RecordCorrupt,
    RecordTooLarge,
    ResponseRecord,
    ResponseStore,
    StoreError,
    StoreUnavailable,
    chain_record,
)


def default_store_url() -> str:
    """The per-user SQLite file: ``$XDG_DATA_HOME/rollout/rollout.db``, by default
    ``~/.local/share/rollout/rollout.db`` (STORE-10)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return "sqlite:///" + str(Path(base) / "rollout" / "rollout.db")


def open_store(
    url: str,
    *,
    ttl_s: float = DEFAULT_TTL_S,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    max_entries: int = DEFAULT_MAX_ENTRIES,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> ResponseStore:
    """The backend named by ``url``. Raises ``ValueError`` with a message for the operator.
    ``max_entries`` and ``max_bytes`` bound ``memory://`` (LIM-5, MEM-15)."""
    scheme = urlsplit(url).scheme
    if scheme == "memory":
        return MemoryStore(max_entries, ttl_s, max_record_bytes, max_bytes)
    if scheme == "sqlite":
        from engine.store.embedded.sqlite import SqliteStore

        path, _, query = url.partition("?")
        options = parse_qs(query)
        synchronous = options.get("synchronous", ["normal"])[-1]
        inline = _switch(options.get("inline", ["on"])[-1], "inline")
        deadline = _seconds(options.get("deadline", ["10"])[-1], "deadline")
        return SqliteStore(
            sqlite_path(path),
            ttl_s,
            max_record_bytes,
            synchronous,
            inline=inline,
            deadline_s=deadline,
        )
    if scheme in ("redis", "rediss"):
        from engine.store.redis import RedisStore

        return RedisStore(url, ttl_s, max_record_bytes)
    if scheme in ("postgresql", "postgres"):
        from engine.store.postgres import PostgresStore

        return PostgresStore(postgres_url(url), ttl_s, max_record_bytes)
    raise ValueError(
        f"--store: unknown store URL {url!r} (sqlite:///PATH, redis://…, postgresql://…, memory://)"
    )


def describe(store: ResponseStore) -> str:
    """For the banner and logs: never a password."""
    from engine.store import postgres
    from engine.store.embedded.sqlite import SqliteStore
    from engine.store.redis import RedisStore

    if isinstance(store, postgres.PostgresStore):
        return postgres.describe(store)
    if isinstance(store, SqliteStore):
        return f"sqlite {store.path}"
    if isinstance(store, RedisStore):
        parts = urlsplit(store.url)
        return f"{parts.scheme}://{parts.hostname}:{parts.port or 6379}{parts.path}"
    return "memory (this process only)"


def _switch(value: str, name: str) -> bool:
    if value.lower() in ("on", "1", "true", "yes"):
        return True
    if value.lower() in ("off", "0", "false", "no"):
        return False
    raise ValueError(f"--store: {name} must be on or off, not {value!r}")


def postgres_url(url: str) -> str:
    """A libpq connection URI names a database: ``postgresql://USER@HOST:PORT/DB`` (libpq's
    own query parameters, e.g. ``?sslmode=require``, pass through)."""
    parts = urlsplit(url)
    if not parts.hostname and "host=" not in parts.query:
        raise ValueError(f"--store: a Postgres URL is postgresql://USER@HOST:PORT/DB, not {url!r}")
    return url


def _seconds(value: str, name: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(f"--store: {name} must be a positive number of seconds, not {value!r}")
    return seconds


def sqlite_path(url: str) -> Path:
    """``sqlite:///data/x.db`` is relative to the working directory, ``sqlite:////abs/x.db``
    absolute (SQLAlchemy's convention); ``~`` is expanded."""
    if not url.startswith("sqlite:///") or len(url) == len("sqlite:///"):
        raise ValueError(f"--store: a SQLite URL is sqlite:///PATH, not {url!r}")
    return Path(url[len("sqlite:///") :]).expanduser()


__all__ = [
    "DEFAULT_MAX_ENTRIES",
    "DEFAULT_MAX_RECORD_BYTES",
    "DEFAULT_TTL_S",
    "SNAPSHOT_EVERY",
    "ChainPoint",
    "ClusterState",
    "DeleteListener",
    "Hydrated",
    "MemoryStore",
    "RecordCorrupt",
    "RecordTooLarge",
    "ResponseRecord",
    "ResponseStore",
    "StoreError",
    "StoreUnavailable",
    "chain_record",
    "default_store_url",
    "describe",
    "listing_form",
    "open_store",
]
