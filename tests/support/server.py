"""One way to start a real server on an ephemeral loopback port, read through public API."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from engine.core import Engine, EngineConfig
from engine.models.router import Router
from engine.server.app import create_app
from engine.server.transport.bodies import RUNNER_OPTIONS
from engine.store import ResponseStore


@dataclass
class LiveServer:
    engine: Engine
    port: int
    runner: web.AppRunner
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/responses"


async def serve_app(
    app: web.Application, ssl_context: ssl.SSLContext | None = None
) -> tuple[web.AppRunner, int]:
    """Serve any aiohttp app (ours, a fake upstream) on 127.0.0.1 and a free port; the caller
    cleans the runner up. The port is the runner's public ``addresses``."""
    runner = web.AppRunner(app, handle_signals=False, access_log=None, **RUNNER_OPTIONS)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context).start()
    return runner, bound_port(runner)


def free_port() -> int:
    """A loopback port nothing listens on now (bound, then released): for a process the test
    starts itself."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def stdout_port(proc: asyncio.subprocess.Process, limit: float = 120) -> int:
    """The port a ``rollout serve --port 0 --announce-port`` child printed on its stdout (a
    pipe), ``PORT <n>``: printed once it listens, so the port is its own (CLUSTER-1)."""
    assert proc.stdout is not None, "start it with stdout=asyncio.subprocess.PIPE"
    while line := await asyncio.wait_for(proc.stdout.readline(), limit):
        if line.startswith(b"PORT "):
            return int(line.split()[1])
    raise AssertionError("the server exited before announcing its port")


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process ``pid`` listens on, read from Linux's ``/proc``: its sockets'
    inodes (``/proc/<pid>/fd``) in the LISTEN rows of ``/proc/net/tcp`` and ``tcp6``. A child
    started on port 0 is found where it really listens, never at a probed port another process
    may have taken (CLUSTER-1's rule, for children that do not announce their port)."""
    inodes: set[str] = set()
    with contextlib.suppress(OSError):
        for fd in os.scandir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(fd.path)
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:[") : -1])
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as rows:
            next(rows)  # the header
            for row in rows:
                fields = row.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def bound_port(runner: web.AppRunner) -> int:
    """The port the runner's (first) site listens on: the one a ``port=0`` site picked."""
    address = runner.addresses[0]
    return int(address[1])


async def start_server(
    config: EngineConfig | None = None,
    router: Router | None = None,
    store: ResponseStore | None = None,
    **app_kwargs: Any,
) -> LiveServer:
    """The engine's app with this config (default: the simulator at full speed, no pacing)."""
    engine = Engine(config or EngineConfig(tokens_per_second=0), router=router, store=store)
    runner, port = await serve_app(create_app(engine, **app_kwargs))
    return LiveServer(engine=engine, port=port, runner=runner)
