"""Real faults under ``rollout serve`` with the SQLite store, each in its own OS process:

* STORE-18: another process takes the database's write lock and is stopped (SIGSTOP) while it
  holds it. A ``store: true`` create answers ``store_unavailable`` at the store's deadline (500:
  the model ran, RETRY-2),
  ``store: false`` keeps working, and once the process is gone service resumes by itself.
* STORE-19 / OBS-2: the server's file size limit (RLIMIT_FSIZE, set on the running process) is
  lowered to about the database's size, so checkpoints cannot grow the database: each failure
  is logged and counted (``store.checkpoint_failed`` in ``/metrics``), and the server stays up.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import resource
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from tests.store._procs import ServeProcess

Serve = Callable[..., Awaitable[ServeProcess]]
ANSWER_S = 4.0  # a create must answer within this (the deadline is 0.5 s; busy waits are 5 s)
LOCKER = """
import os, signal, sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
"""


def _create(store: bool, text: str = "hello") -> dict[str, Any]:
    return {"model": "sim", "input": text, "store": store}


async def _post(http: aiohttp.ClientSession, server: ServeProcess, body: dict[str, Any]) -> Any:
    timeout = aiohttp.ClientTimeout(total=ANSWER_S)
    async with http.post(f"{server.base}/v1/responses", json=body, timeout=timeout) as resp:
        return resp.status, await resp.json()


def _stopped(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "T"


@contextlib.asynccontextmanager
async def _stopped_lock_holder(db: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    """A process holding the write lock of ``db``, stopped: it neither commits nor dies."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", LOCKER, str(db), stdout=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        assert await asyncio.wait_for(proc.stdout.readline(), 30) == b"locked\n"
        for _ in range(400):
            if _stopped(proc.pid):
                break
            await asyncio.sleep(0.01)
        assert _stopped(proc.pid)
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_a_lock_held_by_a_stopped_process_answers_at_the_deadline(
    tmp_path: Path, serve: Serve
) -> None:
    db = tmp_path / "locked.db"
    server = await serve(f"sqlite:///{db}?deadline=0.5")
    async with aiohttp.ClientSession() as http:
        status, _ = await _post(http, server, _create(True))
        assert status == 200
        async with _stopped_lock_holder(db) as holder:
            status, body = await _post(http, server, _create(True))
            assert status == 500, body  # the model ran: never a 503 (RETRY-2)
            assert body["error"]["code"] == "store_unavailable"
            status, _ = await _post(http, server, _create(False))  # only that request
            assert status == 200
            holder.kill()
            await holder.wait()
        status, body = await _post(http, server, _create(True))  # resumes by itself
        assert status == 200, body


async def _checkpoint_failures(http: aiohttp.ClientSession, server: ServeProcess) -> int:
    async with http.get(f"{server.base}/metrics") as resp:
        text = await resp.text()
    found = re.search(r'^rollout_events_total\{event="store.checkpoint_failed"\} (\S+)', text, re.M)
    return 0 if found is None else int(float(found.group(1)))


def _size(path: Path) -> int:
    return path.stat().st_size


async def _grown(db: Path, size: int) -> None:
    for _ in range(600):
        if _size(db) >= size:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{db} never reached {size} bytes: are checkpoints running?")


async def test_a_failing_checkpoint_is_logged_and_counted(tmp_path: Path, serve: Serve) -> None:
    db = tmp_path / "full.db"
    server = await serve(f"sqlite:///{db}")
    assert server.proc is not None
    pid = server.proc.pid
    payload = "x" * 40_000
    async with aiohttp.ClientSession() as http:
        for n in range(24):  # about 2 MB of records
            status, _ = await _post(http, server, _create(True, f"{n} {payload}"))
            assert status == 200
        await _grown(db, 1_500_000)  # checkpointed into the database
        assert await _checkpoint_failures(http, server) == 0
        # The database cannot grow much more; the log, restarted after each checkpoint, still
        # takes a few records at a time.
        limit = max(_size(db), _size(Path(f"{db}-wal"))) + 64 * 1024
        soft, hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (limit, hard))
        try:
            failures = 0
            for n in range(100):  # new records keep arriving; checkpoints cannot land them
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    await _post(http, server, _create(True, f"more {n} {payload}"))
                failures = await _checkpoint_failures(http, server)
                if failures:
                    break
                await asyncio.sleep(0.1)
        finally:
            resource.prlimit(pid, resource.RLIMIT_FSIZE, (soft, hard))
        assert failures >= 1
        assert "checkpoint failed" in server.logs()
        async with http.get(f"{server.base}/healthz") as resp:
            assert resp.status == 200  # still up
        status, _ = await _post(http, server, _create(False))
        assert status == 200
