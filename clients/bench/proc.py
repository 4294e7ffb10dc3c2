"""Start and stop the server under test (``rollout serve --bench-models`` in a subprocess, with
its own interpreter and event loop, as deployed); read its memory and CPU time from /proc.

One server per model speed, because the simulator's speed is a server setting. The bench talks
to it over loopback only, like any client.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

import aiohttp

from clients.bench.suites.instructions import Callgrind

START_TIMEOUT_S = 30.0


@dataclass
class ServerProcess:
    """``async with ServerProcess(tps) as server:`` gives a healthy server at ``server.url``."""

    tokens_per_second: float
    idle_timeout_s: float = 600.0
    # Per-turn stage records (SPEC OBS-5): the scenario and --memory read them; load, stream
    # and the inspector's cost measure run without, so no record sits in the RSS they measure.
    bench_timings: bool = False
    store: str = "memory://"  # --store (BENCH-6)
    config: Path | None = None  # a routing file instead of --bench-models (BENCH-9)
    otel_endpoint: str | None = None  # --otel-endpoint: what tracing costs (OTEL-6)
    keys_file: Path | None = None  # --api-keys-file, with per-key limits (RATE-1)
    counter: Callgrind | None = None  # run under callgrind, counted per mode (BENCH-13)
    port: int = 0
    _proc: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def command(self) -> list[str]:
        """``rollout serve`` (as ``python -m cli``: the same entry point, no PATH lookup) with
        the bench's switches: its models, a free port announced on stdout, no API keys (a key
        set in the environment must not lock the bench out), a backlog for 200 connects, and
        the per-turn timing records when asked for."""
        timings = ["--bench-timings"] if self.bench_timings else []
        if self.otel_endpoint is not None:
            timings += ["--otel-endpoint", self.otel_endpoint]
        if self.keys_file is not None:
            timings += ["--api-keys-file", str(self.keys_file)]
        models = ["--config", str(self.config)] if self.config else ["--bench-models"]
        command = [
            sys.executable, "-m", "cli", "serve",
            *models, "--port", "0", "--announce-port",
            "--tps", repr(self.tokens_per_second),
            "--idle-timeout", repr(self.idle_timeout_s),
            "--api-keys-env", "", "--backlog", "2048", "--log-level", "WARNING", *timings,
            "--store", self.store,
        ]  # fmt: skip
        return command if self.counter is None else self.counter.wrap(command)

    async def __aenter__(self) -> Self:
        self._proc = await asyncio.create_subprocess_exec(
            *self.command(),
            stdout=asyncio.subprocess.PIPE,
        )
        limit = START_TIMEOUT_S * (1 if self.counter is None else 10)  # callgrind: 30-60x slower
        try:
            self.port = await asyncio.wait_for(self._read_port(), limit)
            await wait_healthy(self.url, limit)
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def _read_port(self) -> int:
        assert self._proc is not None and self._proc.stdout is not None
        while True:
            line = await self._proc.stdout.readline()
            if not line:
                raise RuntimeError("the bench server exited before it was ready")
            if line.startswith(b"PORT "):
                return int(line.split()[1])

    async def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.returncode is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 15.0)
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def wait_healthy(base_url: str, timeout_s: float) -> None:
    """Poll ``GET /healthz`` until it answers 200 (the app's startup hooks have run)."""
    root = base_url.rsplit("/v1", 1)[0]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(f"{root}/healthz") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            if loop.time() > deadline:
                raise RuntimeError(f"no healthy server at {root} within {timeout_s:g} s")
            await asyncio.sleep(0.05)


def rss_bytes(pid: int) -> int:
    """Resident set size of a process (``VmRSS`` in /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def sched_ns(pid: int) -> tuple[int, int]:
    """(time on a CPU, time waiting for one) of a process's main thread, in nanoseconds.

    /proc/PID/schedstat has nanosecond resolution (``stat``'s CPU ticks are 10 ms), fine enough
    for one turn; the event loop, and so all request work, runs on the main thread. The wait
    figure shows how much of a turn's latency was this shared machine's CPU contention."""
    running, waiting, _ = Path(f"/proc/{pid}/schedstat").read_text().split()
    return int(running), int(waiting)


def written_bytes(pid: int) -> int:
    """Bytes a process has passed to write calls so far (``wchar`` of /proc/PID/io): for the
    server, what it sent on its sockets (the bench's server logs only warnings)."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise RuntimeError(f"no wchar for process {pid}")


def process_cpu_ns(pid: int) -> int:
    """Time on a CPU of all of a process's threads, in nanoseconds (each thread's schedstat):
    what a library that works in threads of its own costs is counted too."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended meanwhile
    return total


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far (/proc/PID/stat fields 14 and 15)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat.rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")
