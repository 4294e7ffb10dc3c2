"""``postgresql://USER@HOST:PORT/DB`` (or ``postgres://``): the store shared by many processes
and hosts on the database most operators already run (STORE-10, STORE-15), over psycopg 3's
asyncio driver and a bounded ``psycopg_pool.AsyncConnectionPool``.

Records are the same flat bytes as everywhere (the codec's JSON) in one table, with the ids
they link (STORE-5) and their expiry as columns. A turn's write is one autocommitted statement
(an upsert; with the links' expiry extension of STORE-7 in the same statement, as a
data-modifying CTE), so it is durable, with Postgres's default ``synchronous_commit = on``,
once it is acknowledged (STORE-6). Hydration is one round trip: the record and the records it
links, read together by one query over its ``links`` column. Connection failures are retried
once on a fresh connection after the pool has dropped the stale ones a server restart leaves;
every statement here is idempotent (absolute values, upserts), so the retry is safe. Deletes are
announced with ``NOTIFY`` and every process ``LISTEN``s, so their caches drop the response
(STORE-11). Expired rows are invisible at once and swept every 5 minutes (STORE-7).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from engine.store.cluster_state import ClusterState, RecordBlobs
from engine.store.framing import MAX_HEAD
from engine.store.records import (
    DEFAULT_MAX_RECORD_BYTES,
    DEFAULT_TTL_S,
    ResponseStore,
    StoreUnavailable,
)

log = logging.getLogger("rollout.store.postgres")

TABLE = "rollout_responses"
VERSION_TABLE = "rollout_schema_version"
META_TABLE = "rollout_meta"
DELETED_CHANNEL = "rollout_deleted"
# Ordered migrations, each applied once in its own transaction under an advisory lock (many
# nodes start together); the applied version is a row of ``VERSION_TABLE``. Append, never edit.
MIGRATIONS: list[tuple[int, list[str]]] = [
    (
        1,
        [
            f"CREATE TABLE IF NOT EXISTS {TABLE} (id text PRIMARY KEY, record bytea NOT NULL,"
            " links text[] NOT NULL DEFAULT '{}', created_at double precision NOT NULL,"
            " expires_at double precision)",
            f"CREATE INDEX IF NOT EXISTS {TABLE}_expiry ON {TABLE} (expires_at)"
            " WHERE expires_at IS NOT NULL",
        ],
    ),
    # The owner digests' salt (OWN-6): one per store, so every node computes the same digests.
    (2, [f"CREATE TABLE IF NOT EXISTS {META_TABLE} (key text PRIMARY KEY, value bytea NOT NULL)"]),
]
SCHEMA_VERSION = MIGRATIONS[-1][0]
MIGRATION_LOCK = 0x726F6C6C  # pg_advisory_xact_lock key: "roll"
CONNECT_TIMEOUT_S = 2  # libpq's connect_timeout is whole seconds
# Every connection: autocommit (one statement, one transaction), and TCP keepalives so a server
# that vanished without closing the socket (a host gone, a partition) is noticed by the delete
# listener too, which otherwise waits on its socket for ever.
CONNECT_KWARGS: dict[str, Any] = {
    "autocommit": True,
    "connect_timeout": CONNECT_TIMEOUT_S,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
}
COMMAND_TIMEOUT_S = 5.0  # one operation, its retry included (STORE-8)
POOL_SIZE = 8  # connections per process
MAX_WAITING = 1024  # callers waiting for a connection; beyond it, store_unavailable at once
SWEEP_EVERY_S = 300.0
RELISTEN_AFTER_S = 1.0

_LIVE = "(expires_at IS NULL OR expires_at > %(now)s)"
_UPSERT = (
    f"INSERT INTO {TABLE} (id, record, links, created_at, expires_at)"
    " VALUES (%(id)s, %(record)s, %(links)s, %(now)s, %(expires)s)"
    " ON CONFLICT (id) DO UPDATE SET record = EXCLUDED.record, links = EXCLUDED.links,"
    " created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at"
)
# The records our context needs live as long as we do (STORE-7): NULL (never) or the later time.
_UPSERT_AND_EXTEND = (
    f"WITH stored AS ({_UPSERT} RETURNING 1)"
    f" UPDATE {TABLE} SET expires_at = CASE WHEN %(expires)s::float8 IS NULL THEN NULL"
    " ELSE greatest(expires_at, %(expires)s::float8) END"
    " WHERE id = ANY(%(refresh)s) AND expires_at IS NOT NULL"
)
_READ_MANY = f"SELECT id, record FROM {TABLE} WHERE id = ANY(%(ids)s) AND {_LIVE}"
_SCAN = (
    f"SELECT id, substring(record from 1 for {MAX_HEAD}) FROM {TABLE}"
    f" WHERE id > %(after)s AND {_LIVE} ORDER BY id LIMIT %(limit)s"
)
_READ_ONE = f"SELECT record FROM {TABLE} WHERE id = %(id)s AND {_LIVE}"
# Insert this node's salt unless one is kept, and return the kept one, in one statement: a
# row inserted by a concurrent node is seen by the SELECT after the conflict.
_LOAD_SALT = (
    f"WITH ins AS (INSERT INTO {META_TABLE} VALUES ('owner_salt', %(salt)s)"
    " ON CONFLICT (key) DO NOTHING RETURNING value)"
    f" SELECT value FROM ins UNION ALL SELECT value FROM {META_TABLE} WHERE key = 'owner_salt'"
    " LIMIT 1"
)
# The record (n = 0), then each id it links in order (n = 1…), its blob NULL when gone.
_READ_CHAIN = (
    f"WITH head AS (SELECT record, links FROM {TABLE} WHERE id = %(id)s AND {_LIVE})"
    " SELECT 0 AS n, NULL AS id, record FROM head"
    " UNION ALL"
    " SELECT link.n, link.id, r.record FROM head"
    " CROSS JOIN LATERAL unnest(head.links) WITH ORDINALITY AS link(id, n)"
    f" LEFT JOIN {TABLE} r ON r.id = link.id"
    " AND (r.expires_at IS NULL OR r.expires_at > %(now)s)"
    " ORDER BY n"
)
_REPLACE = (
    f"WITH changed AS (UPDATE {TABLE} SET record = %(record)s WHERE id = %(id)s RETURNING 1)"
    f" SELECT pg_notify('{DELETED_CHANNEL}', %(id)s)"
)
_REMOVE = (
    f"WITH gone AS (DELETE FROM {TABLE} WHERE id = %(id)s RETURNING expires_at)"
    f" SELECT pg_notify('{DELETED_CHANNEL}', %(id)s),"
    " (SELECT count(*) FROM gone WHERE expires_at IS NULL OR expires_at > %(now)s)"
)
# Insert unless a live row is there (an expired one is replaced), and return the row that was
# there as of the statement's start: claimed when the insert counted, else the holder's value.
_CLAIM = (
    f"WITH ins AS (INSERT INTO {TABLE} (id, record, links, created_at, expires_at)"
    " VALUES (%(id)s, %(record)s, '{}', %(now)s, %(expires)s)"
    " ON CONFLICT (id) DO UPDATE SET record = EXCLUDED.record, links = EXCLUDED.links,"
    " created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at"
    f" WHERE {TABLE}.expires_at IS NOT NULL AND {TABLE}.expires_at <= %(now)s RETURNING 1)"
    f" SELECT (SELECT count(*) FROM ins), (SELECT record FROM {TABLE} WHERE id = %(id)s)"
)
# Delete a claim only while it holds the releasing holder's value (CONV-7).
_RELEASE = f"DELETE FROM {TABLE} WHERE id = %(id)s AND record = %(record)s"
_SWEEP = f"DELETE FROM {TABLE} WHERE expires_at IS NOT NULL AND expires_at <= %(now)s"

T = TypeVar("T")
Conn = psycopg.AsyncConnection[Any]
Op = Callable[[Conn], Awaitable[T]]


class PostgresClusterState(ClusterState):
    """Postgres's cluster state: idempotency keys and locks claimed in one statement (IDEM-3);
    the rest as on a single-process store."""

    shares_resends = True  # COMPAT-10

    def __init__(self, store: RecordBlobs) -> None:
        super().__init__(store)
        assert isinstance(store, PostgresStore)
        self.postgres = store

    async def _claim(self, key: str, blob: bytes, expires_at: float) -> bytes | None:
        """One statement (IDEM-3); a holder that committed after its snapshot is read by the
        next attempt, as ``_load_salt`` does."""
        params = {"id": key, "record": blob, "now": time.time(), "expires": expires_at}

        async def op(conn: Conn) -> bytes | None:
            for _ in range(3):
                cur = await conn.execute(_CLAIM, params, binary=True)
                row = await cur.fetchone()
                if row is not None and int(row[0]) > 0:
                    return None
                if row is not None and row[1] is not None:
                    return bytes(row[1])
            raise StoreUnavailable("the idempotency key could not be claimed or read")

        return await self.postgres._run(op)

    async def _release(self, key: str, blob: bytes) -> bool:
        """One statement: delete where the row still holds ``blob`` (CONV-7)."""
        params = {"id": key, "record": blob}

        async def op(conn: Conn) -> bool:
            cur = await conn.execute(_RELEASE, params)
            return cur.rowcount > 0

        return await self.postgres._run(op)


class PostgresStore(ResponseStore):
    kind = "postgres"
    cluster_state = PostgresClusterState

    def __init__(
        self,
        url: str,
        ttl_s: float = DEFAULT_TTL_S,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    ) -> None:
        super().__init__(ttl_s, max_record_bytes)
        self.url = url
        self._pool: AsyncConnectionPool[Conn] | None = None
        self._schema_ready = False
        self._tasks: list[asyncio.Task[None]] = []  # the delete listener and the sweeper

    # ------------------------------------------------------------------ lifecycle
    async def open(self) -> None:
        """Creates the schema. A server that is down at start is not fatal (STORE-8): the
        schema is created by the first operation that reaches it. A database whose schema is
        newer than this server's is refused (``StoreUnavailable``)."""
        if self._pool is not None:
            return
        self._pool = AsyncConnectionPool(
            self.url,
            kwargs=dict(CONNECT_KWARGS),
            min_size=1,
            max_size=POOL_SIZE,
            max_waiting=MAX_WAITING,
            timeout=CONNECT_TIMEOUT_S,
            open=False,
            name="rollout-store",
        )
        await self._pool.open(wait=False)
        try:
            await self._probe()
        except (psycopg.OperationalError, OSError) as exc:
            log.warning("postgres store: %s unreachable at start (%s)", _safe(self.url), exc)
            self.available = False
        except psycopg.Error as exc:  # e.g. no right to create the schema: refused at start
            await self.close()
            raise StoreUnavailable(f"cannot prepare {_safe(self.url)}: {exc}") from None
        except BaseException:  # a newer schema (StoreUnavailable), a cancelled start
            await self.close()
            raise
        self._tasks = [
            asyncio.create_task(self._listen(), name="store-postgres-deletes"),
            asyncio.create_task(self._sweep_forever(), name="store-postgres-sweep"),
        ]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    # ------------------------------------------------------------------ primitives
    async def _write(
        self, key: str, blob: bytes, links: Sequence[str], refresh: bool, expires_at: float | None
    ) -> None:
        params = {
            "id": key,
            "record": blob,
            "links": list(links),
            "now": time.time(),
            "expires": expires_at,
            "refresh": list(links) if refresh else [],
        }
        sql = _UPSERT_AND_EXTEND if refresh and links else _UPSERT

        async def op(conn: Conn) -> None:
            await conn.execute(sql, params)

        await self._run(op)

    async def _read(self, keys: Sequence[str]) -> list[bytes | None]:
        params = {"ids": list(keys), "now": time.time()}

        async def op(conn: Conn) -> dict[str, bytes]:
            cur = await conn.execute(_READ_MANY, params, binary=True)
            return {row[0]: row[1] for row in await cur.fetchall()}

        found = await self._run(op)
        return [found.get(key) for key in keys]

    async def _load_salt(self, fresh: bytes) -> bytes:
        """The store's owner salt (OWN-6): the first node to ask keeps its own; every other
        reads that one. One statement: insert if absent, then read whichever row is there."""

        async def op(conn: Conn) -> bytes:
            # A node inserting at the same instant commits after this statement's snapshot:
            # then neither branch sees a row, and the next statement sees its.
            for _ in range(3):
                cur = await conn.execute(_LOAD_SALT, {"salt": fresh}, binary=True)
                row = await cur.fetchone()
                if row is not None:
                    return bytes(row[0])
            raise StoreUnavailable("the owner salt could not be read")

        return await self._run(op)

    async def _read_one(self, key: str) -> bytes | None:
        params = {"id": key, "now": time.time()}

        async def op(conn: Conn) -> bytes | None:
            cur = await conn.execute(_READ_ONE, params, binary=True)
            row = await cur.fetchone()
            return None if row is None else bytes(row[0])

        return await self._run(op)

    async def _read_chain(self, key: str) -> tuple[bytes, dict[str, bytes | None] | None] | None:
        """The record and every record it links in one query (STORE-15)."""
        params = {"id": key, "now": time.time()}

        async def op(conn: Conn) -> list[tuple[int, str | None, bytes | None]]:
            cur = await conn.execute(_READ_CHAIN, params, binary=True)
            return await cur.fetchall()

        rows = await self._run(op)
        if not rows or rows[0][2] is None:
            return None
        links = {link_id: blob for _, link_id, blob in rows[1:] if link_id is not None}
        return rows[0][2], links

    async def _scan(self, cursor: str, limit: int) -> tuple[list[tuple[str, bytes]], str | None]:
        params = {"after": cursor, "limit": limit + 1, "now": time.time()}

        async def op(conn: Conn) -> list[tuple[str, bytes]]:
            cur = await conn.execute(_SCAN, params, binary=True)
            return [(row[0], bytes(row[1])) for row in await cur.fetchall()]

        rows = await self._run(op)
        page = rows[:limit]
        return page, (page[-1][0] if len(rows) > limit else None)

    async def _replace(self, key: str, blob: bytes) -> None:
        params = {"id": key, "record": blob}

        async def op(conn: Conn) -> None:
            await conn.execute(_REPLACE, params)

        await self._run(op)

    async def _remove(self, key: str) -> bool:
        params = {"id": key, "now": time.time()}

        async def op(conn: Conn) -> bool:
            cur = await conn.execute(_REMOVE, params)
            row = await cur.fetchone()
            return row is not None and int(row[1]) > 0

        return await self._run(op)

    async def _ping(self) -> None:
        await self._run(_select_one)

    # ------------------------------------------------------------------ plumbing
    async def _run(self, op: Op[T]) -> T:
        """``op`` on a pooled connection, bounded by the command timeout. While the store is
        known to be down, a connection of its own probes it first: a refused connection fails
        at once, where the pool (waiting out its reconnect backoff) would hold every request
        for its checkout timeout (STORE-8)."""
        pool = self._pool
        if pool is None:
            raise StoreUnavailable("the Postgres store is not open")
        try:
            async with asyncio.timeout(COMMAND_TIMEOUT_S):
                if not self.available or not self._schema_ready:
                    await self._probe()  # also creates the schema if it is missing
                    if not self.available:
                        await pool.check()  # drop the connections the outage left broken
                try:
                    return await _attempt(pool, op)
                except PoolTimeout:
                    raise
                except psycopg.OperationalError as exc:  # a stale connection, or the server
                    log.debug("postgres store: %s; retrying on a fresh connection", exc)
                    await self._probe()  # a server that refuses connections fails here at once
                    await pool.check()
                    return await _attempt(pool, op)
        except (psycopg.Error, OSError) as exc:  # OSError includes the builtin TimeoutError
            raise StoreUnavailable(f"{type(exc).__name__}: {exc}") from None

    async def _probe(self) -> None:
        """A connection of its own: is the server there? It brings the schema to
        ``SCHEMA_VERSION`` on the way (idempotent)."""
        async with await psycopg.AsyncConnection.connect(self.url, **CONNECT_KWARGS) as conn:
            await migrate(conn)
        self._schema_ready = True

    async def _listen(self) -> None:
        """Deletes by any process reach this one's caches (STORE-11); listens again after an
        outage."""
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self.url, **CONNECT_KWARGS
                ) as conn:
                    await conn.execute(f"LISTEN {DELETED_CHANNEL}")
                    async for note in conn.notifies():
                        self.cluster.notify_deleted(note.payload)
            except (psycopg.Error, OSError) as exc:
                log.debug("postgres store: delete channel lost (%s); listening again", exc)
            await asyncio.sleep(RELISTEN_AFTER_S)

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_EVERY_S)
            await self._sweep()

    async def _sweep(self) -> int:
        """Delete expired rows (they are invisible already); every node may sweep."""
        params = {"now": time.time()}

        async def op(conn: Conn) -> int:
            cur = await conn.execute(_SWEEP, params)
            return cur.rowcount

        try:
            gone = await self._run(op)
        except StoreUnavailable as exc:
            log.debug("postgres store: sweep failed: %s", exc)
            return 0
        if gone:
            log.info("postgres store: %d expired responses removed", gone)
        return gone


async def migrate(conn: Conn) -> int:
    """Create or upgrade the schema; refuse a database from a newer server."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        await conn.execute(f"CREATE TABLE IF NOT EXISTS {VERSION_TABLE} (version integer NOT NULL)")
        cur = await conn.execute(f"SELECT max(version) FROM {VERSION_TABLE}")
        row = await cur.fetchone()
        current = int(row[0] or 0) if row is not None else 0
        if current > SCHEMA_VERSION:
            raise StoreUnavailable(
                f"database schema version {current} is newer than this server's {SCHEMA_VERSION}"
            )
        for version, statements in MIGRATIONS:
            if version <= current:
                continue
            for statement in statements:
                await conn.execute(statement)
            await conn.execute(f"INSERT INTO {VERSION_TABLE} (version) VALUES (%s)", (version,))
            log.info("postgres store: schema migrated to version %d", version)
    return SCHEMA_VERSION


async def _attempt(pool: AsyncConnectionPool[Conn], op: Op[T]) -> T:
    async with pool.connection() as conn:
        return await op(conn)


async def _select_one(conn: Conn) -> None:
    await conn.execute("SELECT 1")


def _safe(url: str) -> str:
    """The URL without its password, for logs and the banner."""
    parts = urlsplit(url)
    user = f"{parts.username}@" if parts.username else ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{user}{parts.hostname or ''}{port}{parts.path}"


def describe(store: PostgresStore) -> str:
    return _safe(store.url)


__all__ = ["SCHEMA_VERSION", "PostgresStore", "describe", "migrate"]
