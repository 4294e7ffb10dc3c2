"""CLUSTER-1: a port is a child's only once the child holds it. Another process can take a
probed free port before the child binds it (here: an impostor that answers ``/healthz`` 200, as
any other engine on the machine would); the child then fails its bind, and a health poll on the
port would be answered by the impostor. Seen in CI: a node's port taken, the impostor later gone
and its port reused by a stub, the balancer's WebSocket upgrade answered 405 by the stub."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from cli import launcher
from cli.launcher import Cluster
from tests.cluster.conftest import cluster_spec
from tests.support.server import serve_app


@pytest.fixture
async def impostor() -> AsyncIterator[int]:
    """A server that looks healthy to a poll and is no node: ``/healthz`` 200, nothing else."""

    async def healthy(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_get("/healthz", healthy)
    runner, port = await serve_app(app)
    try:
        yield port
    finally:
        await runner.cleanup()


def _first_probe_taken(port: int) -> Callable[[str], int]:
    """``free_port`` whose first answer is ``port`` (taken by the time it is bound)."""
    real, calls = launcher.free_port, []

    def probe(host: str = "127.0.0.1") -> int:
        calls.append(host)
        return port if len(calls) == 1 else real(host)

    return probe


@pytest.mark.parametrize("balancer", ["haproxy", "nginx"])
async def test_a_taken_port_is_never_taken_for_the_child(
    tmp_path: Path, impostor: int, balancer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(launcher, "free_port", _first_probe_taken(impostor))
    cluster = Cluster(cluster_spec(tmp_path, balancer))
    await cluster.start()
    try:
        assert impostor not in [node.port for node in cluster.nodes]
        assert cluster.port != impostor
        async with aiohttp.ClientSession() as http:
            for port in [cluster.port, *(node.port for node in cluster.nodes)]:
                async with http.get(f"http://127.0.0.1:{port}/v1/models") as resp:
                    assert resp.status == 200, port  # an engine, through the balancer or not
                    assert (await resp.json())["object"] == "list"
    finally:
        await cluster.stop()


async def test_a_redis_that_took_the_port_is_not_taken_for_the_launchers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's port is probed free, then another redis-server takes it before the
    launcher's own binds it: the launcher's exits (address in use), and the other one's PONG
    must not pass for it (two clusters would share one store)."""
    port = launcher.free_port()
    binary = shutil.which("redis-server")
    assert binary is not None, "make sysdeps installs redis-server"
    other = await asyncio.create_subprocess_exec(
        binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", str(tmp_path),
        stdout=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        for _ in range(200):
            if await launcher.redis_pid(port) == other.pid:
                break
            await asyncio.sleep(0.05)
        probes = iter([False])  # the probe ran before the other one listened
        monkeypatch.setattr(launcher, "_redis_answers", lambda _: _answer(next(probes, True)))
        spec = cluster_spec(tmp_path, "haproxy")
        spec.store = f"redis://127.0.0.1:{port}/0"
        cluster = Cluster(spec)
        spec.workdir.mkdir(parents=True)
        with pytest.raises(RuntimeError, match="redis-server exited"):
            await cluster.start_redis()
        await cluster.stop()
    finally:
        other.terminate()
        await other.wait()


async def _answer(value: bool) -> bool:
    return value
