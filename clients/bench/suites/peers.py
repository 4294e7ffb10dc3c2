"""``rollout bench --peers`` (BENCH-10): this engine (on a ``responses`` and on a ``chat``
route), vllm-project's agentic-api, smg and the LiteLLM proxy side by side, each in front of
the same instant stub upstream (``peer_stub``), driven by the openai SDK through the same
K-turn tool chain on every transport each one supports.

The chain: a user message, then K turns; each turn the model (the stub) calls ``read_file``
and the client answers with a 1.5 KB tool output and a short user message ("continue": smg
0.3.2 refused a ``previous_response_id`` input without a message item, and the chain is kept
as it was so that figures compare across runs). Transports:

* ``ws``: ``client.responses.connect()``, ``previous_response_id`` + the new items, store false;
* ``http_previous_id``: ``client.responses.create(stream=True)``, ``previous_response_id`` +
  the new items, store true;
* ``http_stateless``: the same with the whole history every turn, store false.

A transport a target refuses in the 2-turn warm-up is reported as unsupported (with the refusal),
never retried. Per (target, transport), over ``--repeat`` chains interleaved in one run:
wall per turn (first, last, median), the server's CPU per turn (every task of every process in
the server's session, from ``/proc/*/task/*/schedstat``: what a multi-process gateway costs is
counted whole), the stub's CPU per turn, and both ratios to the engine's ``ws`` turn.
Optional peers (``pip install -e '.[peers]'``, or their programs on ``PATH``): a target whose
program is missing is skipped and named so; each peer's version is read and printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from openai import AsyncOpenAI

from clients.bench.suites import instructions
from clients.bench.suites.instructions import Callgrind

TRANSPORTS = ("ws", "http_previous_id", "http_stateless")
TARGETS = ("engine", "engine-chat", "agentic-api", "smg", "litellm")
MODEL = "stub"
MASTER_KEY = "sk-bench-peers-0123456789abcdef"  # LiteLLM refuses to start without one
TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "read_file",
        "description": "Read a file of the project.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    }
]
START_TIMEOUT_S = 120.0


def tool_output(turn: int, size: int = 1536) -> str:
    line = f"turn {turn}: def handler_{turn}(event):  # dispatches the event to its route\n"
    return (line * (size // len(line) + 1))[:size]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def session_cpu_ns(sid: int) -> int:
    """CPU time of every thread of every process whose session is ``sid`` (ns)."""
    total = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) != sid:
                continue
            for task in (proc / "task").iterdir():
                total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            continue
    return total


@dataclass
class Peer:
    """One server under test, started in a session of its own (its CPU is the session's)."""

    name: str
    command: list[str]
    port: int
    health: str  # path polled until it answers 200
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    profile: Path | None = None  # py-spy's raw stacks, from ready to stop (BENCH-11)
    counter: Callgrind | None = None  # instructions per chain, counted (BENCH-12)
    version: str = ""
    proc: asyncio.subprocess.Process | None = None
    spy: asyncio.subprocess.Process | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def cpu_ns(self) -> int:
        assert self.proc is not None
        return session_cpu_ns(self.proc.pid)

    async def start(self, log: Path) -> None:
        command = self.command if self.counter is None else self.counter.wrap(self.command)
        with log.open("wb") as out:
            self.proc = await asyncio.create_subprocess_exec(
                *command, stdout=out, stderr=out, start_new_session=True,
                env={**os.environ, **self.env}, cwd=self.cwd,
            )  # fmt: skip
        slow = 1 if self.counter is None else 10  # callgrind starts a process 30-60x slower
        deadline = time.monotonic() + START_TIMEOUT_S * slow
        async with aiohttp.ClientSession() as http:
            while True:
                if self.proc.returncode is not None:
                    raise RuntimeError(f"{self.name} exited at start (log: {log})")
                with contextlib.suppress(aiohttp.ClientError):
                    headers = {"Authorization": f"Bearer {MASTER_KEY}"}
                    url = f"http://127.0.0.1:{self.port}{self.health}"
                    async with http.get(url, headers=headers) as resp:
                        if resp.status == 200:
                            return await self._profile()
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name} not healthy in {START_TIMEOUT_S:g} s")
                await asyncio.sleep(0.25)

    async def _profile(self) -> None:
        """Attach py-spy once the server is ready: the profile holds serving, not startup."""
        if self.profile is None or self.proc is None:
            return
        spy = shutil.which("py-spy") or _beside_python("py-spy") or "py-spy"
        self.spy = await asyncio.create_subprocess_exec(
            spy, "record", "--native", "--format", "raw", "--rate", "1000",
            "-o", str(self.profile), "--pid", str(self.proc.pid),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        await asyncio.sleep(1.0)  # py-spy attaches

    async def stop(self) -> None:
        spy, self.spy = self.spy, None
        if spy is not None and spy.returncode is None:
            spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
            await asyncio.wait_for(spy.wait(), 60.0)
        proc, self.proc = self.proc, None
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 30.0)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()


def engine_peer(
    stub: str, work: Path, upstream: str, profile: Path | None = None, name: str = "engine"
) -> Peer:
    config = work / f"{name}.toml"
    path = "/v1" if upstream in ("chat", "responses") else ""
    config.write_text(
        f'default = "{MODEL}"\n[models.{MODEL}]\nbackend = "{upstream}"\n'
        f'base_url = "{stub}{path}"\nmodel = "{MODEL}"\n'
    )
    port = free_port()
    command = [
        sys.executable, "-m", "cli", "serve", "--config", str(config), "--port", str(port),
        "--api-keys-env", "", "--log-level", "WARNING", "--store", "memory://",
    ]  # fmt: skip
    return Peer(name, command, port, "/healthz", profile=profile, version=_engine_version())


def agentic_peer(stub: str, work: Path) -> Peer | None:
    """vllm-project's agentic-api: its Rust gateway ``agentic-server`` (the ``agentic-api``
    wheel), reaching the stub through ``/v1/responses``; it stores in SQLite only (its own
    default), here a file in the run's directory (tmpfs where there is one)."""
    program = shutil.which("agentic-server") or _beside_python("agentic-server")
    if program is None:
        return None
    port = free_port()
    command = [
        program, "--llm-api-base", stub, "--gateway-host", "127.0.0.1",
        "--gateway-port", str(port), "--db-url", f"sqlite://{work / 'agentic-api.db'}",
    ]  # fmt: skip
    # HOME: it keeps a state directory there; OPENAI_API_KEY: the key it would forward upstream
    # (never the caller's own); RUST_LOG: warnings only, as every other target logs.
    env = {"HOME": str(work), "OPENAI_API_KEY": MASTER_KEY, "RUST_LOG": "warn"}
    version = program_version(program, ("agentic-api",))
    return Peer("agentic-api", command, port, "/health", env=env, version=version)


def smg_peer(stub: str, work: Path) -> Peer | None:
    program = shutil.which("smg") or _beside_python("smg")
    if program is None:
        return None
    port = free_port()
    command = [
        program, "launch", "--backend", "openai", "--history-backend", "memory",
        "--worker-urls", stub, "--host", "127.0.0.1", "--port", str(port),
        "--log-level", "warn", "--prometheus-host", "127.0.0.1",
        "--prometheus-port", str(free_port()),
    ]  # fmt: skip
    # /readiness: 200 once its worker (the stub) is registered; smg 1.13's /v1/models lists no
    # model for an openai backend.
    version = program_version(program, ("smg", "sglang-router"))
    return Peer("smg", command, port, "/readiness", version=version)


def litellm_peer(stub: str, work: Path) -> Peer | None:
    program = shutil.which("litellm") or _beside_python("litellm")
    if program is None:
        return None
    config = work / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        f"  - model_name: {MODEL}\n"
        "    litellm_params:\n"
        f"      model: openai/{MODEL}\n"
        f"      api_base: {stub}/v1\n"
        "      api_key: none\n"
    )
    port = free_port()
    command = [
        program, "--config", str(config), "--host", "127.0.0.1", "--port", str(port),
        "--num_workers", "1",
    ]  # fmt: skip
    env = {"LITELLM_MASTER_KEY": MASTER_KEY, "LITELLM_LOG": "ERROR"}
    version = program_version(program, ("litellm",))
    return Peer("litellm", command, port, "/health/liveliness", env=env, cwd=work, version=version)


def _beside_python(name: str) -> str | None:
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else None


_VERSION_OF = """import importlib.metadata as m, sys
for name in sys.argv[1:]:
    try:
        print(m.version(name))
        break
    except m.PackageNotFoundError:
        pass
"""


def program_version(program: str, distributions: tuple[str, ...]) -> str:
    """What version a peer is: a Python script's distribution, asked of the interpreter its
    ``#!`` line names (no import of the peer itself); a binary's ``--version``."""
    try:
        with open(program, "rb") as f:
            head = f.read(512)
    except OSError:
        return "?"
    if head.startswith(b"#!"):
        interpreter = head[2:].split(b"\n", 1)[0].decode(errors="replace").split()
        command = [*interpreter, "-c", _VERSION_OF, *distributions]
    else:
        command = [program, "--version"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    words = (done.stdout.splitlines() or [""])[0].split()
    return words[-1] if words else "?"


def _engine_version() -> str:
    """Its version and the interpreter it runs on (the bench's own: the stub and the client
    share the machine's cores with it, so a figure says which)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        own = version("rollout-engine")
    except PackageNotFoundError:
        own = "?"
    return f"{own} (Python {sys.version.split()[0]} of {sys.base_prefix})"


@contextlib.asynccontextmanager
async def stub_process(log: Path) -> AsyncIterator[tuple[str, int]]:
    """The stub upstream in its own process: (base URL, pid)."""
    with log.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "clients.bench.peer_stub",
            stdout=asyncio.subprocess.PIPE, stderr=err, start_new_session=True,
        )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        if not line.startswith(b"PORT "):
            raise RuntimeError(f"the stub upstream did not start (log: {log})")
        yield f"http://127.0.0.1:{int(line.split()[1])}", proc.pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        await proc.wait()


class Unsupported(Exception):
    """The target refused the transport on the chain's first turn."""


@dataclass
class Chain:
    """The K-turn tool chain; one ``turn`` call per model turn."""

    client: AsyncOpenAI
    transport: str
    conn: Any = None
    history: list[Any] = field(default_factory=list)
    previous: str | None = None
    pending: list[Any] = field(default_factory=list)

    def first_input(self) -> list[Any]:
        return [{"type": "message", "role": "user", "content": "Read the dispatcher, then fix it."}]

    async def turn(self, number: int) -> Any:
        new = self.pending or self.first_input()
        body: dict[str, Any] = {"model": MODEL, "tools": TOOLS}
        if self.transport == "http_stateless":
            self.history += new
            body.update(input=self.history, store=False)
        else:
            body.update(input=new, store=self.transport != "ws")
            if self.previous is not None:
                body["previous_response_id"] = self.previous
        response = await (self._ws(body) if self.transport == "ws" else self._http(body))
        call = next(i for i in response.output if i.type == "function_call")
        if self.transport == "http_stateless":
            self.history += [o.model_dump(exclude_none=True) for o in response.output]
        self.previous = response.id
        output = tool_output(number)
        self.pending = [
            {"type": "function_call_output", "call_id": call.call_id, "output": output},
            {"type": "message", "role": "user", "content": "continue"},
        ]
        return response

    async def _http(self, body: dict[str, Any]) -> Any:
        """Read to the stream's end, as the SDK's own helpers and agents do: a stream left at
        its terminal event is closed with its body unread, and httpx then drops the connection
        instead of pooling it (every turn would pay a new TCP connection)."""
        completed = None
        async with await self.client.responses.create(stream=True, **body) as stream:
            async for event in stream:
                if event.type == "response.completed":
                    completed = event.response
                elif event.type in ("response.failed", "error"):
                    raise RuntimeError(f"turn failed: {event.type}")
        if completed is None:
            raise RuntimeError("the stream ended before response.completed")
        return completed

    async def _ws(self, body: dict[str, Any]) -> Any:
        await self.conn.response.create(**body)
        async for event in self.conn:
            if event.type == "response.completed":
                return event.response
            if event.type in ("response.failed", "error"):
                raise RuntimeError(f"turn failed: {getattr(event, 'error', event.type)}")
        raise RuntimeError("the socket closed before response.completed")


async def run_chain(peer: Peer, transport: str, turns: int, stub_pid: int) -> dict[str, Any]:
    """One chain on one transport: per-turn wall and CPU (server's session, stub's)."""
    client = AsyncOpenAI(base_url=peer.base_url, api_key=MASTER_KEY, max_retries=0)
    chain = Chain(client, transport)
    walls: list[float] = []
    server: list[float] = []
    stub: list[float] = []
    counter, pid, counted = peer.counter, peer.proc.pid if peer.proc is not None else 0, 0
    try:
        async with contextlib.AsyncExitStack() as stack:
            if counter is not None:
                await counter.begin(pid)
            if transport == "ws":
                try:
                    chain.conn = await stack.enter_async_context(client.responses.connect())
                except Exception as exc:
                    raise Unsupported(_short(exc)) from exc
            for number in range(turns):
                cpu0, stub0 = peer.cpu_ns(), session_cpu_ns(stub_pid)
                started = time.perf_counter()
                try:
                    await chain.turn(number)
                except Exception as exc:
                    if number == 0:
                        raise Unsupported(_short(exc)) from exc
                    raise
                walls.append((time.perf_counter() - started) * 1000)
                server.append((peer.cpu_ns() - cpu0) / 1e6)
                stub.append((session_cpu_ns(stub_pid) - stub0) / 1e6)
            if counter is not None:
                counted = await counter.end(pid)
    finally:
        await client.close()
    run: dict[str, Any] = {"wall_ms": walls, "server_cpu_ms": server, "stub_cpu_ms": stub}
    if counter is not None:
        run["instructions_per_turn"] = counted / max(1, turns)
    return run


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:200]}"


@dataclass
class PeerSettings:
    turns: int = 25
    repeat: int = 3
    targets: tuple[str, ...] = TARGETS
    engine_upstream: str = "responses"
    transports: tuple[str, ...] = TRANSPORTS
    profile: Path | None = None  # py-spy's raw stacks of the engine (BENCH-11)
    callgrind: bool = False  # count instructions per turn (BENCH-12)


async def run_peers(settings: PeerSettings) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "settings": {
            "turns": settings.turns, "repeat": settings.repeat,
            "engine_upstream": settings.engine_upstream, "cpus": os.cpu_count(),
            "loadavg_at_start": list(os.getloadavg()),
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        },
        "skipped": {}, "unsupported": {}, "runs": [],
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-peers-", dir=_work_root()) as tmp:
        work = Path(tmp)
        async with stub_process(work / "stub.log") as (stub, stub_pid):
            peers = _peers(settings, stub, work, doc["skipped"])
            doc["settings"]["versions"] = {peer.name: peer.version for peer in peers}
            try:
                for peer in peers:
                    print(f"starting {peer.name} …", file=sys.stderr, flush=True)
                    await peer.start(work / f"{peer.name}.log")
                await _interleaved(peers, settings, stub_pid, doc)
            finally:
                for peer in peers:
                    await peer.stop()
    doc["settings"]["loadavg_at_end"] = list(os.getloadavg())
    doc["summary"] = summarize(doc["runs"])
    return doc


def _work_root() -> str | None:
    """tmpfs where there is one: agentic-api's SQLite file stays off the disk, as the other
    targets keep their state in memory."""
    return "/dev/shm" if os.path.isdir("/dev/shm") else None


def _peers(settings: PeerSettings, stub: str, work: Path, skipped: dict[str, str]) -> list[Peer]:
    peers: list[Peer] = []
    for name in settings.targets:
        if settings.callgrind and name not in instructions.COUNTED:
            skipped[name] = "not counted under callgrind (its workers are child processes)"
            continue
        if name == "engine":
            peer: Peer | None = engine_peer(stub, work, settings.engine_upstream, settings.profile)
        elif name == "engine-chat":
            peer = engine_peer(stub, work, "chat", name=name)
        else:
            peer = {"agentic-api": agentic_peer, "smg": smg_peer, "litellm": litellm_peer}[name](
                stub, work
            )
        if peer is None:
            skipped[name] = "not installed (pip install -e '.[peers]')"
            continue
        if settings.callgrind:
            peer.counter = instructions.Callgrind(work, name)
        peers.append(peer)
    return peers


async def _interleaved(
    peers: list[Peer], settings: PeerSettings, stub_pid: int, doc: dict[str, Any]
) -> None:
    """A 2-turn warm-up per (target, transport), then ``repeat`` rounds, each running every
    supported pair once, the order rotated between rounds."""
    unsupported: dict[str, str] = doc["unsupported"]
    pairs = [(p, t) for p in peers for t in settings.transports]
    for peer, transport in pairs:
        try:
            await run_chain(peer, transport, 2, stub_pid)
        except Unsupported as exc:
            unsupported[f"{peer.name}/{transport}"] = str(exc)
        except Exception as exc:  # the second turn: e.g. an id passed through to the stub
            unsupported[f"{peer.name}/{transport}"] = "second turn: " + _short(exc)
    live = [(p, t) for p, t in pairs if f"{p.name}/{t}" not in unsupported]
    for round_ in range(settings.repeat):
        shift = round_ % max(1, len(live))
        for peer, transport in live[shift:] + live[:shift]:
            print(f"  {peer.name} {transport} (round {round_ + 1})", file=sys.stderr, flush=True)
            run = await run_chain(peer, transport, settings.turns, stub_pid)
            doc["runs"].append({"target": peer.name, "transport": transport, **run})


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per ``target/transport``: medians over repeats of each turn index, then first, last and
    median over the turns; CPU per turn is the median turn's."""
    out: dict[str, Any] = {}
    keys = sorted({(r["target"], r["transport"]) for r in runs}, key=_order)
    for target, transport in keys:
        mine = [r for r in runs if r["target"] == target and r["transport"] == transport]
        row: dict[str, Any] = {}
        for key in ("wall_ms", "server_cpu_ms", "stub_cpu_ms"):
            per_turn = [statistics.median(v) for v in zip(*(r[key] for r in mine), strict=True)]
            row[key] = {
                "first": per_turn[0], "last": per_turn[-1],
                "median": statistics.median(per_turn), "mean": statistics.fmean(per_turn),
            }  # fmt: skip
        counted = [r["instructions_per_turn"] for r in mine if "instructions_per_turn" in r]
        if counted:  # BENCH-12: each chain's mean turn, the median over repeats
            row["instructions_per_turn"] = statistics.median(counted)
        out[f"{target}/{transport}"] = row
    base = out.get("engine/ws")
    if base is not None:
        for row in out.values():
            for key in ("wall_ms", "server_cpu_ms"):
                row[f"{key}_vs_engine_ws"] = row[key]["median"] / max(base[key]["median"], 1e-9)
            if "instructions_per_turn" in row and "instructions_per_turn" in base:
                ratio = row["instructions_per_turn"] / max(base["instructions_per_turn"], 1.0)
                row["instructions_vs_engine_ws"] = ratio
    return out


def _order(pair: tuple[str, str]) -> tuple[int, int]:
    target, transport = pair
    return (TARGETS.index(target) if target in TARGETS else 99, TRANSPORTS.index(transport))


def render(doc: dict[str, Any]) -> str:
    s = doc["settings"]
    lines = [
        f"peers: {s['turns']}-turn tool chain, {s['repeat']} repeats, engine route "
        f"{s['engine_upstream']} (engine-chat: chat), load average "
        f"{s['loadavg_at_start'][0]:.2f} → {s.get('loadavg_at_end', [0.0])[0]:.2f}",
        "versions: " + ", ".join(f"{n} {v}" for n, v in s.get("versions", {}).items()),
        f"{'target/transport':30s} {'wall ms/turn (first/last/median)':>34s} "
        f"{'server CPU ms/turn':>19s} {'stub CPU':>9s} {'CPU x':>6s} {'wall x':>6s}",
    ]
    for name, row in doc["summary"].items():
        w, c, st = row["wall_ms"], row["server_cpu_ms"], row["stub_cpu_ms"]
        lines.append(
            f"{name:30s} {w['first']:10.2f} {w['last']:10.2f} {w['median']:10.2f}   "
            f"{c['median']:19.2f} {st['median']:9.2f} "
            f"{row.get('server_cpu_ms_vs_engine_ws', float('nan')):6.2f} "
            f"{row.get('wall_ms_vs_engine_ws', float('nan')):6.2f}"
        )
    counted = [(n, r) for n, r in doc["summary"].items() if "instructions_per_turn" in r]
    if counted:
        lines.append("instructions per turn (callgrind, BENCH-12; wall and CPU above are not)")
        for name, row in counted:
            ratio = row.get("instructions_vs_engine_ws", float("nan"))
            lines.append(f"{name:30s} {row['instructions_per_turn'] / 1e6:10.3f} M   {ratio:6.2f}")
    for name, why in {**doc["unsupported"], **doc["skipped"]}.items():
        lines.append(f"{name:30s} not run: {why}")
    return "\n".join(lines)


def write_png(path: Path, doc: dict[str, Any]) -> None:
    """Two panels: server CPU per turn and wall per turn (medians), one bar per pair."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(doc["summary"])
    fig, axes = plt.subplots(1, 2, figsize=(12, 0.5 * len(names) + 2))
    for ax, key, label in (
        (axes[0], "server_cpu_ms", "server CPU ms / turn (median)"),
        (axes[1], "wall_ms", "wall ms / turn (median)"),
    ):
        values = [doc["summary"][n][key]["median"] for n in names]
        colors = ["#1f77b4" if n.startswith("engine") else "#999" for n in names]
        ax.barh(names, values, color=colors)
        ax.invert_yaxis()
        ax.set_xlabel(label)
    fig.suptitle(f"rollout bench --peers ({doc['settings']['turns']} turns)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
