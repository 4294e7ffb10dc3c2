"""One way to measure what a real ``rollout serve`` process holds: start it with a memory
budget and a store on disk (so records live there, not in its heap), read its resident size
from ``/proc/<pid>/status`` and what its budget counts from ``/debug/stats``.

The RSS tests beside it compare the two: what the budget counts must be memory
the process really holds (MEM-10..MEM-12)."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from tests.support.server import stdout_port

MIB = 1024 * 1024
KEYS_ENV = "RSS_NODE_KEYS"
ADMIN_ENV = "RSS_NODE_ADMIN"


def rss(pid: int | None = None) -> int:
    """The resident size of process ``pid`` (this one if None), in bytes."""
    status = Path(f"/proc/{pid if pid is not None else 'self'}/status").read_text()
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@asynccontextmanager
async def budget_node(
    tmp_path: Path, budget: int, *extra: str, keys: Sequence[str] = (), operator: str = ""
) -> AsyncIterator[tuple[int, int]]:
    """A ``rollout serve`` process on an ephemeral port with ``--memory-budget budget`` and a
    SQLite store under ``tmp_path``, taking ``keys`` and the admin key ``operator`` from its
    environment (never its command line; no keys: an open server): its port and pid."""
    env = {**os.environ, KEYS_ENV: ",".join(keys), ADMIN_ENV: operator}
    closed = ("--api-keys-env", KEYS_ENV, "--admin-keys-env", ADMIN_ENV) if keys else ()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cli", "serve", "--port", "0", "--announce-port", "--tps", "0",
        "--store", f"sqlite:///{tmp_path / 'rss.db'}", "--memory-budget", str(budget),
        "--log-level", "ERROR", *closed, *extra, stdout=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    try:
        yield await stdout_port(proc), proc.pid
    finally:
        proc.kill()
        await proc.wait()


async def operator_stats(
    http: aiohttp.ClientSession, port: int, operator: str = ""
) -> dict[str, Any]:
    """``/debug/stats`` read with the admin key (none on an open server)."""
    headers = {"Authorization": f"Bearer {operator}"} if operator else {}
    async with http.get(f"http://127.0.0.1:{port}/debug/stats", headers=headers) as resp:
        assert resp.status == 200
        stats: dict[str, Any] = await resp.json()
    return stats
