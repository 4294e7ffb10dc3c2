"""STORE-5, STORE-7, STORE-8, STORE-15: what only the Postgres store does, against the real
server: one statement per write and per hydration (read from the server's own statement log),
expired rows swept, a link whose row is gone outright, a server that is down at start, and a
user without the right to create the schema."""

from __future__ import annotations

import asyncio
import contextlib
import re
import uuid
from collections.abc import AsyncIterator

import psycopg
import pytest

from clients.bench.services.pg_cluster import PostgresCluster
from engine.store import SNAPSHOT_EVERY, StoreUnavailable, chain_record
from engine.store.postgres import DELETED_CHANNEL, TABLE, PostgresStore
from protocol.items import InputItem, Message
from protocol.response import Response


def _response(n: int) -> Response:
    return Response(id=f"resp_{n:04d}", created_at=0, model="sim", status="completed")


def _rows(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        return [row[0] for row in conn.execute(f"SELECT id FROM {TABLE} ORDER BY id")]


async def test_one_statement_per_write_and_per_hydration(
    postgres_cluster: PostgresCluster, postgres_url: str
) -> None:
    """The server logs every statement of the store's connections: hydrating a response with
    a full set of links is one, and so is each write, with or without the links' expiry
    extension (STORE-7)."""
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        name = conn.info.dbname
        conn.execute(f"ALTER DATABASE {name} SET log_statement = 'all'")
    store = PostgresStore(postgres_url, ttl_s=3600)
    await store.open()
    try:
        context: list[InputItem] = []
        point = None
        for n in range(SNAPSHOT_EVERY):  # the last record links all 15 before it
            context.append(Message(role="user", content=f"turn {n}"))
            record = chain_record(_response(n), [], context, point)
            if n == SNAPSHOT_EVERY - 1:
                record.links_expire_at = 0.0  # its links must be extended: the CTE write
                async with _statements(postgres_cluster, postgres_url) as logged:
                    await store.put(record)
                assert len(logged) == 1 and "WITH stored AS" in logged[0], logged
            else:
                await store.put(record)
            point = record.point
        assert len(record.links) == SNAPSHOT_EVERY - 1
        async with _statements(postgres_cluster, postgres_url) as logged:
            hydrated = await store.hydrate(record.id)
        assert hydrated is not None and hydrated.items == context
        assert len(logged) == 1 and "unnest(head.links)" in logged[0], logged
    finally:
        await store.close()


@contextlib.asynccontextmanager
async def _statements(cluster: PostgresCluster, url: str) -> AsyncIterator[list[str]]:
    """The statements the server logged inside the block, between two marker queries."""
    logged: list[str] = []
    tag = f"mark-{uuid.uuid4().hex}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"SELECT '{tag}-begin'")
        yield logged
        conn.execute(f"SELECT '{tag}-end'")
    log = (cluster.root / "server.log").read_text(errors="replace")
    inside = log.split(f"{tag}-begin", 1)[1].split(f"{tag}-end", 1)[0]
    lines = [
        line
        for line in inside.splitlines()
        if re.search(r"LOG:  (statement|execute)", line)
        # the delete channel's LISTEN (STORE-11): its own connection, made when the store opens,
        # reaches the log whenever that connection is up (late on a loaded machine)
        and f"LISTEN {DELETED_CHANNEL}" not in line
    ]
    logged.extend(line for line in lines[:-1])  # the last is the end marker itself


async def test_sweep_removes_expired_rows_only(postgres_url: str) -> None:
    short, kept = PostgresStore(postgres_url, ttl_s=0.5), PostgresStore(postgres_url, ttl_s=0)
    await short.open()
    await kept.open()
    try:
        await short.put(chain_record(_response(1), [], [Message(role="user", content="a")], None))
        await kept.put(chain_record(_response(2), [], [Message(role="user", content="b")], None))
        assert await short._sweep() == 0  # nothing has expired yet
        await asyncio.sleep(0.7)  # past its expiry: the TTL plus 1%
        assert await short.get("resp_0001") is None  # invisible at once (STORE-7)
        assert _rows(postgres_url) == ["resp_0001", "resp_0002"]  # until the sweep
        assert await short._sweep() == 1
        assert _rows(postgres_url) == ["resp_0002"]
    finally:
        await short.close()
        await kept.close()


async def test_hydration_with_a_link_gone_is_not_found(postgres_url: str) -> None:
    """The one-query hydration reads a missing link as gone, never a shorter context."""
    store = PostgresStore(postgres_url)
    await store.open()
    try:
        root = chain_record(_response(1), [], [Message(role="user", content="a")], None)
        await store.put(root)
        child = chain_record(_response(2), [], [Message(role="user", content="a")] * 2, root.point)
        await store.put(child)
        hydrated = await store.hydrate(child.id)
        assert hydrated is not None and len(hydrated.items) == 2
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f"DELETE FROM {TABLE} WHERE id = %s", (root.id,))
        assert await store.hydrate(child.id) is None
        assert await store.get(child.id) is not None  # the record itself is still there
    finally:
        await store.close()


async def test_down_at_start_then_schema_on_first_contact(
    postgres_cluster: PostgresCluster, postgres_url: str
) -> None:
    await asyncio.to_thread(postgres_cluster.stop)
    store = PostgresStore(postgres_url)
    try:
        await store.open()  # not fatal (STORE-8)
        assert not store.available
        record = chain_record(_response(1), [], [Message(role="user", content="a")], None)
        with pytest.raises(StoreUnavailable):
            await store.put(record)
        await asyncio.to_thread(postgres_cluster.start)
        await store.put(record)  # creates the schema on the way
        assert store.available and await store.get(record.id) is not None
    finally:
        await store.close()
        postgres_cluster.ensure_running()


async def test_a_user_who_may_not_create_the_schema_is_refused_at_start(
    postgres_url: str,
) -> None:
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("CREATE ROLE reader LOGIN")
        conn.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
    reader = postgres_url.replace("rollout@", "reader@")
    with pytest.raises(StoreUnavailable, match="cannot prepare"):
        await PostgresStore(reader).open()
