"""The store behind the bench's server (``rollout bench --store``, BENCH-6).

``memory`` (the default) keeps the transport comparison free of storage cost. ``sqlite`` is a
fresh file in a temp dir; ``redis`` a ``redis-server`` of the bench's own on a free loopback
port (Redis's default durability: append-only file, fsync every second), stopped afterwards;
``postgres`` a private PostgreSQL cluster (``clients/bench/services/pg_cluster.py``:
Postgres's default durability, every commit fsynced), removed afterwards; any store URL is used as
given.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

KINDS = ("memory", "sqlite", "redis", "postgres")
START_TIMEOUT_S = 10.0


@contextlib.asynccontextmanager
async def store_url(kind: str) -> AsyncIterator[str]:
    """The ``--store`` URL for the server under test, alive for the ``with`` block."""
    if kind == "memory":
        yield "memory://"
    elif kind == "sqlite":
        with tempfile.TemporaryDirectory(prefix="rollout-bench-") as tmp:
            yield f"sqlite:///{Path(tmp) / 'bench.db'}"
    elif kind == "redis":
        with tempfile.TemporaryDirectory(prefix="rollout-bench-redis-") as tmp:
            async with _redis_server(Path(tmp)) as url:
                yield url
    elif kind == "postgres":
        async with _postgres_cluster() as url:
            yield url
    else:
        yield kind  # a URL


@contextlib.asynccontextmanager
async def _redis_server(workdir: Path) -> AsyncIterator[str]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("--store redis needs redis-server (apt-get install redis-server)")
    port = _free_port()
    proc = await asyncio.create_subprocess_exec(
        binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir),
        "--save", "", "--appendonly", "yes", "--appendfsync", "everysec",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        await asyncio.wait_for(_answers_ping(port), START_TIMEOUT_S)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()


@contextlib.asynccontextmanager
async def _postgres_cluster() -> AsyncIterator[str]:
    from clients.bench.services.pg_cluster import PostgresCluster

    cluster = await asyncio.to_thread(PostgresCluster)
    try:
        await asyncio.to_thread(cluster.start)
        yield await asyncio.to_thread(cluster.create_database)
    finally:
        await asyncio.to_thread(cluster.destroy)


async def _answers_ping(port: int) -> None:
    while True:
        with contextlib.suppress(OSError):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"PING\r\n")
            reply = await reader.read(16)
            writer.close()
            if reply.startswith(b"+PONG"):
                return
        await asyncio.sleep(0.05)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port
