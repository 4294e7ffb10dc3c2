"""``rollout serve --workers N``: N server processes on one port (SPEC: WORK-1..WORK-4).

The parent does no serving. It starts N copies of ``rollout serve`` with the same arguments,
each its own process and event loop, all binding the port with ``SO_REUSEPORT`` so the kernel
spreads connections over them. They share whatever ``--store`` is configured (an in-memory
store is per process). Metrics are aggregated through ``prometheus_client``'s multiprocess mode
over a temporary ``PROMETHEUS_MULTIPROC_DIR`` the parent creates and removes (WORK-3).

SIGTERM or SIGINT to the parent is forwarded to every worker; each drains as a single server
does (LIM-13) and the parent exits when all have exited. A worker that dies on its own takes
the others down (the parent exits non-zero) rather than leaving a silently smaller pool.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable
from types import FrameType

log = logging.getLogger("rollout.workers")
WORKER_FLAG = "--worker-index"  # hidden: marks a child (reuse the port, no banner)
PARENT_ENV = "ROLLOUT_WORKERS_PARENT"  # the parent's pid, so a worker can tell it is orphaned
READY_ENV = "ROLLOUT_WORKERS_READY_FD"  # a pipe a worker writes one byte to once it listens
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def follow_parent() -> None:
    """In a worker: receive SIGTERM (a graceful drain) when the parent dies, even by SIGKILL,
    so no worker outlives its pool (WORK-2). Linux ``prctl``; a no-op elsewhere."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is not None:
        libc = ctypes.CDLL(libc_name, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    expected = os.environ.get(PARENT_ENV)
    if expected is not None and os.getppid() != int(expected):  # it died before prctl ran
        os.kill(os.getpid(), signal.SIGTERM)


def report_listening() -> None:
    """In a worker, once its socket listens: tell the parent, which announces the port only
    when every worker does (WORK-1). Closing the pipe's end also says "not coming" if the
    worker dies before."""
    fd = os.environ.pop(READY_ENV, None)
    if fd is None:
        return
    try:
        os.write(int(fd), b"1")
    finally:
        os.close(int(fd))


def worker_argv(argv: list[str]) -> list[str]:
    """The parent's ``serve`` arguments without ``--workers`` (children are single servers)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--workers":
            skip = True
            continue
        if arg.startswith("--workers="):
            continue
        out.append(arg)
    return out


def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound (not listening) to ``host:port`` with ``SO_REUSEPORT``: it fixes the
    number of ``--port 0`` for the workers, and holds the port for the pool's lifetime. Only
    listening sockets receive connections, so it never takes one."""
    reserved = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        reserved.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        reserved.bind((host, port))
    except OSError:
        reserved.close()
        raise
    return reserved


def run_workers(serve_argv: list[str], count: int, on_listening: Callable[[], None]) -> int:
    """Start ``count`` workers, call ``on_listening`` once all of them listen, forward stop
    signals, wait for all; the exit status."""
    metrics_dir = tempfile.mkdtemp(prefix="rollout-metrics-")
    ready, ready_w = os.pipe()
    env = {
        **os.environ,
        "PROMETHEUS_MULTIPROC_DIR": metrics_dir,
        PARENT_ENV: str(os.getpid()),
        READY_ENV: str(ready_w),
    }
    base = [sys.executable, "-m", "cli", "serve", *worker_argv(serve_argv)]
    pool = _Pool()
    previous = {sig: signal.signal(sig, pool.forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for index in range(count):
            pool.start([*base, WORKER_FLAG, str(index)], env, keep_fd=ready_w)
        os.close(ready_w)  # now only the workers hold it: EOF once each wrote or died
        if _count_listening(ready) == count:
            on_listening()
        return pool.wait()
    finally:
        os.close(ready)
        pool.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        shutil.rmtree(metrics_dir, ignore_errors=True)


def _count_listening(ready: int) -> int:
    """Workers that reported listening, read until every worker has written or died (EOF)."""
    seen = 0
    while chunk := os.read(ready, 64):
        seen += len(chunk)
    return seen


class _Pool:
    def __init__(self) -> None:
        self.children: dict[int, subprocess.Popen[bytes]] = {}
        self.stopping = False

    def start(self, argv: list[str], env: dict[str, str], keep_fd: int) -> None:
        child = subprocess.Popen(argv, env=env, pass_fds=(keep_fd,))
        self.children[child.pid] = child

    def forward(self, signum: int = signal.SIGTERM, _frame: FrameType | None = None) -> None:
        """The stop signal goes to every live worker; each drains on its own (WORK-2)."""
        self.stopping = True
        for child in self.children.values():
            if child.returncode is None:
                child.send_signal(signum)

    def wait(self) -> int:
        """Reap workers as they exit (a signal handler may run meanwhile: PEP 475 resumes the
        wait). An exit nobody asked for stops the rest; the status is 0 only for a clean stop."""
        status = 0
        while any(child.returncode is None for child in self.children.values()):
            pid, raw = os.waitpid(-1, 0)
            child = self.children.get(pid)
            if child is None:
                continue
            child.returncode = os.waitstatus_to_exitcode(raw)
            if not self.stopping:
                log.error(
                    "worker %d exited with status %d; stopping the others", pid, child.returncode
                )
                status = 1
                self.forward()
            elif child.returncode != 0:
                status = status or child.returncode
        return status

    def stop(self) -> None:
        """Nothing outlives the parent: stop and reap whatever still runs."""
        self.forward()
        for child in self.children.values():
            if child.returncode is None:
                child.wait()
