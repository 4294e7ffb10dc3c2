"""STORE-17: no fsync ever runs on the event loop's thread. ``rollout serve`` runs as its own
process with the SQLite store (idle fast path on, STORE-13); ``strace -f`` (Debian's package,
``.ci/sysdeps``) records every sync system call of every thread while a chain of stored turns
runs across several checkpoints (one per second), and the loop's thread (the process's main
thread: its TID is the PID) must have made none. The other threads must have made some (the
checkpoints and the log restarts after them), so the tracer is seen to work."""

from __future__ import annotations

import asyncio
import re
import shutil
import signal
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp

from tests.store._chain import Chain, body, http_create
from tests.store._procs import ServeProcess

Serve = Callable[..., Awaitable[ServeProcess]]
SYNCS = "fsync,fdatasync,sync_file_range,syncfs,sync,msync"
TURNS = 40
PAUSE_S = 0.1  # 40 turns, 0.1 s apart: about four checkpoint rounds pass under the chain
CALL = re.compile(r"^(\d+)\s+(?:<\.\.\. )?(fsync|fdatasync|sync_file_range|syncfs|sync|msync)\b")


def _traced(pid: int) -> bool:
    """Every thread of ``pid`` has a tracer attached."""
    tasks = list(Path(f"/proc/{pid}/task").iterdir())
    for task in tasks:
        status = (task / "status").read_text()
        tracer = re.search(r"^TracerPid:\s+(\d+)", status, re.M)
        if tracer is None or tracer.group(1) == "0":
            return False
    return bool(tasks)


async def _start_strace(pid: int, out: Path) -> asyncio.subprocess.Process:
    binary = shutil.which("strace")
    assert binary is not None, "strace missing: `make sysdeps` (.ci/sysdeps) installs it"
    tracer = await asyncio.create_subprocess_exec(
        binary, "-f", "-qq", "-e", f"trace={SYNCS}", "-o", str(out), "-p", str(pid),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    for _ in range(200):
        if tracer.returncode is not None:
            _, err = await tracer.communicate()
            raise AssertionError(f"strace could not attach (ptrace allowed?): {err.decode()}")
        if _traced(pid):
            return tracer
        await asyncio.sleep(0.025)
    raise AssertionError("strace did not attach to every thread")


def _syncs_by_thread(out: Path) -> Counter[int]:
    calls: Counter[int] = Counter()
    for line in out.read_text().splitlines():
        match = CALL.match(line)
        if match is not None and "resumed>" not in line:
            calls[int(match.group(1))] += 1
    return calls


async def test_the_event_loop_thread_never_syncs(tmp_path: Path, serve: Serve) -> None:
    server = await serve(f"sqlite:///{tmp_path / 'loop.db'}")
    assert server.proc is not None
    loop_tid = server.proc.pid  # asyncio runs in the main thread, whose TID is the PID
    out = tmp_path / "syncs.txt"
    tracer = await _start_strace(loop_tid, out)
    try:
        chain = Chain()
        async with aiohttp.ClientSession() as http:
            for step in range(TURNS):
                chain.accept(await http_create(http, server.base, body(chain.last, step)))
                await asyncio.sleep(PAUSE_S)
    finally:
        tracer.send_signal(signal.SIGINT)  # detaches and flushes its output
        await asyncio.wait_for(tracer.wait(), 30)
    calls = _syncs_by_thread(out)
    elsewhere = sum(n for tid, n in calls.items() if tid != loop_tid)
    assert elsewhere > 0, f"no sync seen on any thread: is the tracer working? {calls}"
    assert calls[loop_tid] == 0, f"{calls[loop_tid]} sync calls on the event loop's thread"
