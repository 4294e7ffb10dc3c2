"""``rollout bench --chaos`` (SPEC: CHAOS-1..CHAOS-3): faults under load, counted.

``rollout cluster`` (its own process, as an operator runs it: two nodes behind HAProxy on a
redis-server with its append-only file, API keys on) carries load from several client
processes: HTTP agents, each a chain of ``store: true`` tool turns. Every ``interval`` seconds
one node is killed with SIGKILL (they alternate) and the launcher starts it again (CLUSTER-15);
once, half an interval after the first kill, the Redis is stopped and the launcher starts it
again on its append-only file. Per fault the report gives the client-visible errors until the
next fault, how long the launcher took to have the child back, and how long until the clients'
next acknowledged response. After the load every acknowledged response (a 200 ``completed``,
``store: true``) is read back through the balancer: ``acknowledged_lost`` must be 0.

A client request that fails is counted and the agent goes on from its last acknowledged
response (a new chain if it has none), as a client that retries would.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import re
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from clients.bench.scenario import coding_model
from clients.bench.suites.load_checks import TOOLS, tool_output

KEY = "chaos-key"  # the one tenant of the chaos cluster (its nodes require keys)
KEYS_ENV = "ROLLOUT_CHAOS_KEYS"
OPERATOR, OPERATOR_ENV = "chaos-operator", "ROLLOUT_CHAOS_ADMIN"  # reads /debug/stats (AUTH-11)
START_TIMEOUT_S = 90.0
RETRY_AFTER_S = 0.1  # a client's pause before it tries again after an error
TURNS = 8  # tool turns per chain: long enough to cross faults, short enough to start anew


@dataclass
class ChaosSettings:
    seconds: float = 90.0  # load duration; faults every ``interval`` within it
    interval: float = 20.0
    client_processes: int = 3
    agents_per_process: int = 4
    redis_restart: bool = True
    node_kills: int | None = None  # None: one every interval while the load runs


@dataclass
class Launched:
    """The ``rollout cluster`` child and what its output said: the balancer's port, the
    current pid of each child it names, and when each was (re)started."""

    proc: asyncio.subprocess.Process
    port: int = 0
    pids: dict[str, int] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)  # each node's own port
    restarted: list[tuple[float, str]] = field(default_factory=list)  # (time.time(), name)


async def launch(workdir: Path, extra: Sequence[str] = ()) -> Launched:
    """``python -m cli cluster`` on free ports, with keys (``extra``: more serve flags, the
    soak's); returns once its balancer routes."""
    env = {**os.environ, KEYS_ENV: KEY, OPERATOR_ENV: OPERATOR}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cli", "cluster", "--port", "0", "--announce-port",
        "--store", f"redis://127.0.0.1:{_free_port()}/0", "--workdir", str(workdir),
        "--drain-delay", "0.5", "--", "--tps", "0", "--bench-models",
        "--api-keys-env", KEYS_ENV, "--log-level", "ERROR", *extra,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, env=env,
    )  # fmt: skip
    launched = Launched(proc)
    assert proc.stdout is not None
    deadline = time.monotonic() + START_TIMEOUT_S
    while launched.port == 0:
        line = await asyncio.wait_for(proc.stdout.readline(), deadline - time.monotonic())
        if not line:
            raise RuntimeError("rollout cluster exited before it listened")
        _note(launched, line.decode())
    return launched


def _note(launched: Launched, line: str) -> None:
    """Read one launcher line: the banner's pids, PORT, and 'X restarted (pid N)'."""
    if line.startswith("PORT "):
        launched.port = int(line.split()[1])
    for index, (port, pid) in enumerate(re.findall(r"127\.0\.0\.1:(\d+) \(pid (\d+)\)", line)):
        launched.pids[f"node{index}"] = int(pid)
        launched.ports[f"node{index}"] = int(port)
    if found := re.search(r"\(redis-server pid (\d+)", line):
        launched.pids["redis"] = int(found.group(1))
    if found := re.search(r"(\w+) restarted \(pid (\d+)\)", line):
        launched.pids[found.group(1)] = int(found.group(2))
        launched.restarted.append((time.time(), found.group(1)))


async def _follow(launched: Launched) -> None:
    assert launched.proc.stdout is not None
    while line := await launched.proc.stdout.readline():
        _note(launched, line.decode())


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# ---------------------------------------------------------------- the load (child processes)
Outcome = tuple[float, str, str]  # (time.time(), "ok" or an error kind, response id or "")


async def _agent(http: aiohttp.ClientSession, url: str, until: float, out: list[Outcome]) -> None:
    """Chains of ``store: true`` tool turns until ``until``; a failure goes on from the last
    acknowledged response."""
    last: dict[str, Any] | None = None
    while time.time() < until:
        body: dict[str, Any] = {"model": coding_model(TURNS), "tools": TOOLS, "store": True}
        if last is None:
            body["input"] = "Fix the tests."
        else:
            body["previous_response_id"] = last["id"]
            body["input"] = [tool_output(last["output"][-1]["call_id"])]
        try:
            async with http.post(f"{url}/responses", json=body) as resp:
                payload = await resp.json(content_type=None)
                status = resp.status
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            out.append((time.time(), type(exc).__name__, ""))
            await asyncio.sleep(RETRY_AFTER_S)
            continue
        if status != 200 or payload.get("status") != "completed":
            code = (payload.get("error") or {}).get("code", "") if isinstance(payload, dict) else ""
            out.append((time.time(), f"{status} {code}".strip(), ""))
            await asyncio.sleep(RETRY_AFTER_S)
            continue
        out.append((time.time(), "ok", payload["id"]))
        done = payload["output"][-1]["type"] != "function_call"
        last = None if done else payload


def _ready() -> None:
    time.sleep(0.5)  # held, so that each of the pool's processes takes one


def _share(url: str, agents: int, until: float) -> list[Outcome]:
    async def run() -> list[Outcome]:
        out: list[Outcome] = []
        headers = {"Authorization": f"Bearer {KEY}"}
        timeout = aiohttp.ClientTimeout(total=30)
        async with aiohttp.ClientSession(headers=headers, timeout=timeout) as http:
            await asyncio.gather(*(_agent(http, url, until, out) for _ in range(agents)))
        return out

    return asyncio.run(run())


# ---------------------------------------------------------------- faults and the report
async def _faults(launched: Launched, settings: ChaosSettings, start: float) -> list[Any]:
    """Every ``interval``: SIGKILL a node (alternating); once, stop Redis (SIGTERM)."""
    plan: list[tuple[float, str, int]] = []
    at, index = settings.interval, 0
    while at < settings.seconds - 2 and index < (settings.node_kills or 1 << 30):
        plan.append((at, f"node{index % 2}", signal.SIGKILL))
        at, index = at + settings.interval, index + 1
    if settings.redis_restart and "redis" in launched.pids:
        plan.append((min(settings.interval * 1.5, settings.seconds - 2), "redis", signal.SIGTERM))
    plan.sort()
    done: list[dict[str, Any]] = []
    for offset, name, sig in plan:
        await asyncio.sleep(max(0.0, start + offset - time.time()))
        # One node down at a time: a node kill waits until the node killed before is back (on
        # a busy machine a node can take longer than an interval to start; killing the other
        # then measures nothing but an empty cluster). A late fault shows in its ``at_s``.
        if name.startswith("node"):
            await _until_back(launched, [f for f in done if f["child"].startswith("node")])
        if time.time() >= start + settings.seconds - 1:
            break
        pid = launched.pids[name]
        os.kill(pid, sig)
        kind = "kill -9" if sig == signal.SIGKILL else "restart"
        done.append({"fault": f"{kind} {name}", "at": time.time(), "child": name, "pid": pid})
    return done


def _report(
    faults: list[dict[str, Any]], outcomes: list[Outcome], launched: Launched, start: float
) -> list[dict[str, Any]]:
    rows = []
    for i, fault in enumerate(faults):
        t0 = fault["at"]
        t1 = faults[i + 1]["at"] if i + 1 < len(faults) else float("inf")
        window = [o for o in outcomes if t0 <= o[0] < t1]
        errors = [kind for _, kind, _ in window if kind != "ok"]
        back = [t for t, name in launched.restarted if name == fault["child"] and t >= t0]
        first_ok = [t for t, kind, _ in window if kind == "ok"]
        rows.append(
            {
                "fault": fault["fault"],
                "at_s": round(t0 - start, 1),
                "client_errors": len(errors),
                "error_kinds": sorted(set(errors)),
                "child_back_after_s": round(min(back) - t0, 2) if back else None,
                "first_ack_after_s": round(min(first_ok) - t0, 2) if first_ok else None,
                "last_error_after_s": round(max(t for t, kind, _ in window if kind != "ok") - t0, 2)
                if errors
                else 0.0,
            }
        )
    return rows


async def _until_back(launched: Launched, faults: list[dict[str, Any]]) -> None:
    """Wait (bounded) until the launcher reported every faulted child started again: a node
    slow to start on a busy machine is still measured, and the read-back sees the whole
    cluster."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        restarted = launched.restarted
        if all(any(n == f["child"] and t >= f["at"] for t, n in restarted) for f in faults):
            return
        await asyncio.sleep(0.1)


async def _verify(url: str, ids: list[str]) -> dict[str, int]:
    """Every acknowledged id, read back through the balancer (retrying a 5xx a few times)."""
    lost = unreadable = 0
    headers = {"Authorization": f"Bearer {KEY}"}
    async with aiohttp.ClientSession(headers=headers) as http:
        sem = asyncio.Semaphore(16)

        async def one(response_id: str) -> str:
            async with sem:
                for _ in range(5):
                    try:
                        async with http.get(f"{url}/responses/{response_id}") as resp:
                            if resp.status == 200:
                                return "ok"
                            if resp.status == 404:
                                return "lost"
                    except aiohttp.ClientError:
                        pass
                    await asyncio.sleep(0.5)
                return "unreadable"

        for verdict in await asyncio.gather(*(one(i) for i in ids)):
            lost += verdict == "lost"
            unreadable += verdict == "unreadable"
    return {"acknowledged": len(ids), "acknowledged_lost": lost, "unreadable": unreadable}


async def run_chaos(settings: ChaosSettings, workdir: Path | None = None) -> dict[str, Any]:
    """Start the cluster, load it from ``client_processes`` processes, inject the faults,
    verify, stop the cluster; the report (CHAOS-2)."""
    with tempfile.TemporaryDirectory(prefix="rollout-chaos-") as tmp:
        launched = await launch(workdir or Path(tmp))
        follower = asyncio.create_task(_follow(launched))
        url = f"http://127.0.0.1:{launched.port}/v1"
        try:
            loop = asyncio.get_running_loop()
            context = multiprocessing.get_context("spawn")
            k = settings.client_processes
            with ProcessPoolExecutor(max_workers=k, mp_context=context) as pool:
                # every client process up and importing done before the clock starts
                await asyncio.gather(*(loop.run_in_executor(pool, _ready) for _ in range(k)))
                start = time.time()
                until = start + settings.seconds
                shares = [
                    loop.run_in_executor(pool, _share, url, settings.agents_per_process, until)
                    for _ in range(k)
                ]
                faults = await _faults(launched, settings, start)
                outcomes = [o for share in await asyncio.gather(*shares) for o in share]
            await _until_back(launched, faults)
            acked = [rid for _, kind, rid in outcomes if kind == "ok"]
            verified = await _verify(url, acked)
        finally:
            launched.proc.send_signal(signal.SIGINT)
            await launched.proc.wait()
            follower.cancel()
    errors = [o for o in outcomes if o[1] != "ok"]
    return {
        "settings": vars(settings),
        "requests": len(outcomes),
        "client_errors": len(errors),
        "faults": _report(faults, outcomes, launched, start),
        **verified,
    }
