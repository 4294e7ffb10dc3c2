"""Fixtures (STORE-TEST-1, STORE-TEST-2): a real ``redis-server`` on an ephemeral port with its
data in a temp dir, killed at teardown; one private PostgreSQL cluster for the session, with a
fresh database per test; ``rollout serve`` processes cleaned up the same way."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from clients.bench.services.pg_cluster import PostgresCluster
from tests.store._procs import RedisServer, ServeProcess


@pytest.fixture
async def redis_server(tmp_path: Path) -> AsyncIterator[RedisServer]:
    workdir = tmp_path / "redis"
    workdir.mkdir()
    server = RedisServer(workdir)
    await server.start()
    try:
        yield server
    finally:
        await server.kill()


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[PostgresCluster]:
    """Started once (initdb takes a few seconds); a test that stops it starts it again."""
    cluster = PostgresCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture
def postgres_url(postgres_cluster: PostgresCluster) -> str:
    """A fresh database of the session's cluster: no test sees another's records. The cluster
    is started again first if an earlier test left it stopped."""
    postgres_cluster.ensure_running()
    return postgres_cluster.create_database()


@pytest.fixture
async def serve(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[ServeProcess]]]:
    """``await serve(store_url, *flags)``: a started ``rollout serve`` process."""
    started: list[ServeProcess] = []

    async def make(store: str, *extra: str) -> ServeProcess:
        proc = ServeProcess(store, tmp_path, *extra)
        started.append(proc)
        await proc.start()
        return proc

    try:
        yield make
    finally:
        for proc in started:
            await proc.kill9()


@pytest.fixture(params=["sqlite", "redis", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each durable backend in turn: a SQLite file in a temp dir, a real Redis, a real Postgres."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'data' / 'rollout.db'}"
    if request.param == "postgres":
        url: str = request.getfixturevalue("postgres_url")
        return url
    redis: RedisServer = request.getfixturevalue("redis_server")
    return redis.url
