"""Real processes for the store tests: ``redis-server`` (Debian's package, installed by
``.ci/sysdeps``) and ``rollout serve``, each on an ephemeral loopback port, stopped, killed and
restarted by the tests. Nothing is mocked. A port is a process's only once it holds it
(CLUSTER-1's rule, the launcher's helpers): ``rollout serve`` picks its own at its first start
and announces it; a Redis is up once the Redis on its port is that very process."""

from __future__ import annotations

import asyncio
import shutil
import signal
import sys
from pathlib import Path

from cli.launcher import announced_port, redis_pid
from tests.support.server import free_port
from tests.support.wait import wait_for, wait_healthy


class RedisServer:
    """One ``redis-server`` with its data in ``workdir``: append-only file fsynced on every
    write, so what it acknowledged survives its own restart too."""

    def __init__(self, workdir: Path, appendfsync: str = "always") -> None:
        self.workdir = workdir
        self.appendfsync = appendfsync
        self.port = free_port()
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary is not None, "redis-server missing: `make sysdeps` installs it"
        self.proc = await asyncio.create_subprocess_exec(
            binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.workdir),
            "--save", "", "--appendonly", "yes", "--appendfsync", self.appendfsync,
            "--protected-mode", "no", "--logfile", str(self.workdir / "redis.log"),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        proc = self.proc

        async def ours() -> bool:
            if proc.returncode is not None:
                raise AssertionError(f"redis-server exited with {proc.returncode} (port taken?)")
            return await redis_pid(self.port) == proc.pid

        await wait_for(ours, f"this redis-server on port {self.port}")

    async def stop(self) -> None:
        """A clean shutdown (SIGTERM)."""
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(self.proc.wait(), 20)
        self.proc = None

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        self.proc = None


class ServeProcess:
    """``rollout serve`` as its own OS process (``python -m cli serve``)."""

    def __init__(self, store: str, workdir: Path, *extra: str) -> None:
        self.store = store
        self.workdir = workdir
        self.extra = extra
        self.port = 0  # its own pick at the first start, kept for restarts
        self.proc: asyncio.subprocess.Process | None = None
        self.starts = 0

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/responses"

    async def start(self) -> None:
        self.starts += 1
        path = self.workdir / f"serve-{self.starts}.log"
        log = path.open("wb")
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "cli", "serve", "--port", str(self.port), "--announce-port",
            "--store", self.store, "--tps", "0", "--log-level", "WARNING", *self.extra,
            stdout=log, stderr=log,
        )  # fmt: skip
        log.close()
        self.port = await announced_port(path, 0, self.proc, 60)
        await self._wait_healthy()

    async def _wait_healthy(self) -> None:
        assert self.proc is not None
        await wait_healthy(
            f"{self.base}/healthz", "rollout serve to start", limit=60,  # a loaded machine
            process=self.proc, logs=self.logs,
        )  # fmt: skip

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in self.workdir.glob("serve-*.log"))

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(self.proc.wait(), 30) == 0, self.logs()
        self.proc = None

    async def kill9(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        self.proc = None
