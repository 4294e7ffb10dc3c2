"""``rollout cluster`` as the operator runs it (CLUSTER-1, DRAIN-5, CLUSTER-15): its own process,
the banner and ``PORT`` line, SIGHUP for a rolling restart, a node killed -9 restarted while the
other serves, SIGINT to stop everything, and no child left behind, even when the launcher
itself is killed."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from cli.launcher import free_port

ROOT = Path(__file__).resolve().parents[2]
# A launcher, a redis-server, two nodes and HAProxy, each started (and restarted) as processes:
# a minute on a loaded 2-core machine, so the hang limit is the cluster tests' own.
pytestmark = pytest.mark.timeout(240)
_LAUNCHED: list[asyncio.subprocess.Process] = []


@pytest.fixture(autouse=True)
async def _stop_launchers() -> AsyncIterator[None]:
    """A test that fails half-way leaves no launcher (and so no cluster) running: SIGINT stops
    it and its children (CLUSTER-1), SIGKILL if it does not exit."""
    yield
    while _LAUNCHED:
        proc = _LAUNCHED.pop()
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
            try:
                await asyncio.wait_for(proc.wait(), 60)
            except TimeoutError:
                proc.kill()
                await proc.wait()


async def _launch(tmp_path: Path, stderr: bool = False) -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cli", "cluster", "--port", "0", "--announce-port",
        "--store", f"redis://127.0.0.1:{free_port()}/0", "--workdir", str(tmp_path / "c"),
        "--drain-delay", "0.5", "--", "--tps", "0", "--api-keys-env", "",
        cwd=ROOT, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE if stderr else None,
    )  # fmt: skip
    _LAUNCHED.append(proc)
    assert proc.stdout is not None
    banner = ""
    while not banner.endswith("\n") or not banner.splitlines()[-1].startswith("PORT "):
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        assert line, f"the launcher exited: {banner}"
        banner += line
    return proc, banner


def _children(banner: str) -> list[int]:
    return [int(pid) for pid in re.findall(r"\(pid (\d+)\)", banner)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"


async def _answer(port: int) -> str:
    async with aiohttp.ClientSession() as http:
        body = {"model": "sim", "input": "hi", "store": True}
        async with http.post(f"http://127.0.0.1:{port}/v1/responses", json=body) as resp:
            assert resp.status == 200
            response_id: str = (await resp.json())["id"]
            return response_id


async def test_sighup_rolls_and_sigint_stops_everything(tmp_path: Path) -> None:
    proc, banner = await _launch(tmp_path)
    assert proc.stdout is not None
    port = int(banner.split("PORT ")[-1])
    before = _children(banner)
    assert len(before) == 3  # two nodes and the balancer (the Redis it started is not listed)
    first = await _answer(port)
    proc.send_signal(signal.SIGHUP)
    line = b""
    while b"rolling restart done" not in line:
        line = await asyncio.wait_for(proc.stdout.readline(), 120)
        assert line, "the launcher exited during the rolling restart"
    assert not any(_alive(pid) for pid in before[:2])  # both nodes were replaced
    stored = f"http://127.0.0.1:{port}/v1/responses/{first}"  # made before: still there
    async with aiohttp.ClientSession() as http, http.get(stored) as resp:
        assert resp.status == 200
    await _answer(port)
    proc.send_signal(signal.SIGINT)
    assert await asyncio.wait_for(proc.wait(), 60) == 0
    assert not any(_alive(pid) for pid in before)


async def test_no_child_outlives_a_killed_launcher(tmp_path: Path) -> None:
    proc, banner = await _launch(tmp_path)
    children = _children(banner)
    proc.kill()
    await proc.wait()
    for _ in range(200):  # PR_SET_PDEATHSIG: each child got SIGTERM and drains
        if not any(_alive(pid) for pid in children):
            break
        await asyncio.sleep(0.1)
    assert not any(_alive(pid) for pid in children)


async def _line_with(stream: asyncio.StreamReader, text: str) -> str:
    """The launcher's next output line containing ``text`` (bounded)."""
    while True:
        line = (await asyncio.wait_for(stream.readline(), 60)).decode()
        assert line, f"the launcher exited before printing {text!r}"
        if text in line:
            return line


async def test_a_killed_node_is_restarted_while_the_other_serves(tmp_path: Path) -> None:
    """CLUSTER-15: ``kill -9`` of one node under the launcher: the balancer routes around it (every
    request through it answers 200), the launcher starts it again on its port (a new pid that
    answers /healthz), and nothing else stopped; SIGINT still stops everything."""
    proc, banner = await _launch(tmp_path, stderr=True)
    assert proc.stdout is not None and proc.stderr is not None
    port = int(banner.split("PORT ")[-1])
    nodes = re.findall(r"127\.0\.0\.1:(\d+) \(pid (\d+)\)", banner)
    victim_port, victim = int(nodes[0][0]), int(nodes[0][1])
    os.kill(victim, signal.SIGKILL)
    # Once it is gone (reaped by the launcher): a request sent in the instant of its death may
    # have reached it, and is not retried by the balancer (RETRY-3: only an Idempotency-Key
    # makes that retry harmless), so the requests start after.
    restarted = await _line_with(proc.stderr, "node0 exited (-9)")
    assert "restarting in" in restarted
    for _ in range(6):  # while node0 is down or restarting: the other node answers
        await _answer(port)
    line = await _line_with(proc.stdout, "node0 restarted")
    pid = int(re.findall(r"pid (\d+)", line)[0])
    assert pid != victim and _alive(pid)
    health = f"http://127.0.0.1:{victim_port}/healthz"
    async with aiohttp.ClientSession() as http, http.get(health) as resp:
        assert resp.status == 200  # back on its own port
    assert proc.returncode is None  # the launcher, the balancer and the other node kept going
    await _answer(port)
    proc.send_signal(signal.SIGINT)
    assert await asyncio.wait_for(proc.wait(), 60) == 0
    assert not _alive(pid)
