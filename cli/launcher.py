"""``rollout cluster`` (``make cluster``): a redis-server, N ``rollout serve`` nodes and a load
balancer (HAProxy, or nginx) in front, in the foreground until interrupted (SPEC CLUSTER-1).

Every child is this process's own: started with ``PR_SET_PDEATHSIG`` (it gets SIGTERM if the
launcher dies, even by SIGKILL), stopped in reverse order on SIGINT/SIGTERM (nodes drain first,
DRAIN-1..DRAIN-3, then the balancer, then the Redis it started). A child that exits unasked (a
node killed -9, a crashed Redis) is started again after a back-off that doubles while it keeps
failing (CLUSTER-15); the balancer routes around a dead node meanwhile. Only SIGINT/SIGTERM
stops the cluster. SIGHUP restarts the nodes one
at a time (a rolling restart, DRAIN-5): each drains, exits, starts again on its port, and the
next goes only once the balancer routes to it again.

The balancer configs are the templates in ``deploy/`` (``haproxy.cfg.in``, ``nginx.conf.in``),
rendered into the work directory; the same files the tests run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp

from engine.server.process.workers import follow_parent

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
START_TIMEOUT_S = 30.0
# A restarted child has this long to answer (CLUSTER-15): it is waited for on its own task, and
# a busy machine can take longer than a first start may.
RESTART_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 60.0
# CLUSTER-15: a child that exits unasked waits this long before its restart, doubled after each
# restart that did not stay up STABLE_S, up to the cap.
RESTART_FIRST_S, RESTART_MAX_S, STABLE_S = 0.5, 30.0, 10.0


def add_cluster_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("cluster", help="redis-server + N nodes + HAProxy/nginx, in the foreground")
    p.add_argument("--nodes", type=int, default=2, help="rollout serve processes")
    p.add_argument("--host", default="127.0.0.1", help="the balancer's address")
    p.add_argument("--port", type=int, default=8000, help="the balancer's port (0: a free one)")
    p.add_argument(
        "--store", default="redis://127.0.0.1:6379/0",
        help="shared store; a loopback redis:// nobody answers on is started here",
    )  # fmt: skip
    p.add_argument("--balancer", choices=["haproxy", "nginx"], default="haproxy")
    p.add_argument("--workdir", type=Path, default=Path("data/cluster"), help="configs, logs")
    p.add_argument(
        "--drain-delay", type=float, default=1.5,
        help="each node's --drain-delay: longer than the balancer's health check takes, s",
    )  # fmt: skip
    p.add_argument(
        "--announce-port", action="store_true", help="print 'PORT <n>' once the balancer is up"
    )
    p.add_argument("serve_args", nargs=argparse.REMAINDER, help="after --: more serve flags")


def run_cluster(args: argparse.Namespace) -> int:
    extra = [a for a in args.serve_args if a != "--"]
    spec = ClusterSpec(
        nodes=args.nodes, host=args.host, port=args.port, store=args.store,
        balancer=args.balancer, workdir=args.workdir.resolve(),
        drain_delay_s=args.drain_delay, serve_args=extra,
    )  # fmt: skip
    try:
        return asyncio.run(_foreground(spec, args.announce_port))
    except KeyboardInterrupt:
        return 0


@dataclass
class ClusterSpec:
    nodes: int = 2
    host: str = "127.0.0.1"
    port: int = 0
    store: str = "redis://127.0.0.1:6379/0"
    balancer: str = "haproxy"
    workdir: Path = Path("data/cluster")
    drain_delay_s: float = 1.5
    serve_args: Sequence[str] = ()
    env: Mapping[str, str] | None = None  # the children's environment (None: the launcher's)
    # Node index -> the source tree it runs instead of this one (its working directory and
    # PYTHONPATH): another release's checkout, for a mixed-version cluster (LIVE-10's test).
    trees: Mapping[int, Path] = field(default_factory=dict)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


async def _spawn(
    argv: Sequence[str], log: Path, env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> asyncio.subprocess.Process:
    with log.open("ab") as out:
        return await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out, env=env, cwd=cwd,
            preexec_fn=follow_parent,  # no child outlives the launcher
        )  # fmt: skip


async def _terminate(proc: asyncio.subprocess.Process | None) -> int | None:
    """SIGTERM, wait (a node drains: LIM-13), SIGKILL only past the bound."""
    if proc is None:
        return None
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), STOP_TIMEOUT_S)
        except TimeoutError:
            proc.kill()
            await proc.wait()
    return proc.returncode


async def wait_http(
    url: str, proc: asyncio.subprocess.Process, ok: int = 200, within_s: float = START_TIMEOUT_S
) -> None:
    """Poll ``url`` until it answers ``ok`` (or the process exits: an error)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    async with aiohttp.ClientSession() as http:
        while loop.time() < deadline:
            if proc.returncode is not None:
                raise RuntimeError(f"{url}: the process exited with {proc.returncode}")
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with http.get(url) as resp:
                    if resp.status == ok:
                        return
            await asyncio.sleep(0.05)
    raise RuntimeError(f"{url}: no answer within {within_s:g} s")


async def announced_port(
    log: Path, offset: int, proc: asyncio.subprocess.Process, within_s: float
) -> int:
    """The port a node printed (``PORT <n>``, ``--announce-port``) in ``log`` past ``offset``:
    printed only once it listens, so the port is the node's own, never a probe's guess that
    another process took meanwhile (whose answers a health poll would take for the node's)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while loop.time() < deadline:
        with log.open("rb") as out:
            out.seek(offset)
            for line in out.read().splitlines():
                if line.startswith(b"PORT "):
                    return int(line[5:])
        if proc.returncode is not None:
            raise RuntimeError(f"{log}: the node exited with {proc.returncode}")
        await asyncio.sleep(0.05)
    raise RuntimeError(f"{log}: no port announced within {within_s:g} s")


@dataclass
class Node:
    """One ``rollout serve`` on a loopback port: a free one the node picks itself at its first
    start (``--port 0``, announced), the same one at a restart."""

    index: int
    port: int
    argv: list[str]  # without --port
    log: Path
    proc: asyncio.subprocess.Process | None = None
    env: Mapping[str, str] | None = None
    tree: Path | None = None  # another source tree to run (ClusterSpec.trees); None: this one

    async def start(self, within_s: float = START_TIMEOUT_S) -> None:
        """Start (again) on its port; with ``tree``, that tree's ``rollout serve`` (``-m cli``
        from its directory, it first on PYTHONPATH), so a restart may change the release."""
        offset = self.log.stat().st_size if self.log.exists() else 0
        argv = [*self.argv, "--port", str(self.port), "--announce-port"]
        env = self.env
        if self.tree is not None:
            env = {**(env if env is not None else os.environ), "PYTHONPATH": str(self.tree)}
        self.proc = await _spawn(argv, self.log, env, self.tree)
        self.port = await announced_port(self.log, offset, self.proc, within_s)
        await wait_http(f"http://127.0.0.1:{self.port}/healthz", self.proc, within_s=within_s)

    async def stop(self) -> int | None:
        proc, self.proc = self.proc, None
        return await _terminate(proc)


@dataclass
class Cluster:
    """The running processes of one ``ClusterSpec``; ``start``/``stop``/``rolling_restart``."""

    spec: ClusterSpec
    nodes: list[Node] = field(default_factory=list)
    redis: asyncio.subprocess.Process | None = None
    balancer: asyncio.subprocess.Process | None = None
    port: int = 0
    _balancer_argv: list[str] = field(default_factory=list)
    _key_args: list[str] = field(default_factory=list)  # the nodes' one reasoning key (SEAL-5)

    @property
    def url(self) -> str:
        return f"http://{self.spec.host}:{self.port}/v1"

    async def start(self) -> None:
        self.spec.workdir.mkdir(parents=True, exist_ok=True)
        self._key_args = shared_key_args(self.spec.workdir, self.spec.serve_args)
        try:
            await self.start_redis()
            for index in range(self.spec.nodes):
                self.nodes.append(await self._start_node(index))
            await self._start_balancer()
        except BaseException:
            await self.stop()
            raise

    async def _start_node(self, index: int) -> Node:
        node = self._node(index)
        try:
            await node.start()
        except BaseException:
            await node.stop()
            raise
        return node

    def _node(self, index: int) -> Node:
        argv = [
            sys.executable, "-m", "cli", "serve", "--host", "127.0.0.1",
            "--store", self.spec.store, "--drain-delay", repr(self.spec.drain_delay_s),
            "--node-id", node_id(index),
            "--log-level", "WARNING", *self._key_args, *self.spec.serve_args,
        ]  # fmt: skip
        log = self.spec.workdir / f"node{index}.log"
        return Node(index, 0, argv, log, env=self.spec.env, tree=self.spec.trees.get(index))

    async def start_redis(self) -> None:
        """A loopback ``redis://`` that answers nothing yet gets its own redis-server."""
        url = urlsplit(self.spec.store)
        if url.scheme != "redis" or url.hostname not in ("127.0.0.1", "localhost"):
            return
        port = url.port or 6379
        if await _redis_answers(port):
            self.redis = None  # somebody else's: not this launcher's to restart
            return
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is missing: `make sysdeps` installs it")
        self.redis = await _spawn(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(self.spec.workdir),
             "--save", "", "--appendonly", "yes", "--appendfsync", "everysec"],
            self.spec.workdir / "redis.log",
        )  # fmt: skip
        for _ in range(200):
            if self.redis.returncode is not None:
                code = self.redis.returncode
                raise RuntimeError(f"redis-server exited with {code} (port {port})")
            if await redis_pid(port) == self.redis.pid:  # ours, not one that took the port
                return
            await asyncio.sleep(0.05)
        raise RuntimeError(f"redis-server did not answer on port {port}")

    async def _start_balancer(self, attempts: int = 3) -> None:
        """The balancer on ``spec.port``, or on a free one: a probed port that another process
        takes before the balancer binds it makes the balancer exit; then a fresh port, up to
        ``attempts`` times. Any other failure (the nodes never healthy) is raised at once."""
        for attempt in range(attempts):
            self.port = self.spec.port or free_port(self.spec.host)
            config = render_balancer(
                self.spec.balancer, self.spec.host, self.port,
                [f"127.0.0.1:{n.port}" for n in self.nodes], self.spec.workdir,
            )  # fmt: skip
            if self.spec.balancer == "haproxy":
                self._balancer_argv = [_binary("haproxy"), "-db", "-f", str(config)]
            else:
                self._balancer_argv = [
                    _binary("nginx"), "-c", str(config), "-p", str(self.spec.workdir)
                ]  # fmt: skip
            await self.respawn_balancer()
            try:
                await self.wait_routed()
                return
            except RuntimeError:
                balancer, self.balancer = self.balancer, None
                exited = balancer is not None and balancer.returncode is not None
                await _terminate(balancer)
                if self.spec.port or not exited or attempt == attempts - 1:
                    raise

    async def respawn_balancer(self) -> None:
        """The balancer on its rendered config and port (again, after a crash: CLUSTER-15)."""
        log = self.spec.workdir / f"{self.spec.balancer}.log"
        self._bound_marker().unlink(missing_ok=True)
        self.balancer = await _spawn(self._balancer_argv, log)

    def _bound_marker(self) -> Path:
        """What shows the balancer's listeners bound: HAProxy's admin socket answering (it
        serves only once every listener is bound), nginx's pid file (written after the bind,
        never by an nginx that failed it)."""
        name = "haproxy.sock" if self.spec.balancer == "haproxy" else "nginx.pid"
        return self.spec.workdir / name

    async def _bound(self) -> bool:
        marker = self._bound_marker()
        if self.spec.balancer != "haproxy":
            return marker.exists()
        # the admin socket answers once HAProxy runs, all its listeners bound
        answer = await _ask(asyncio.open_unix_connection(str(marker)), b"show info\n")
        return b"Name: HAProxy" in answer

    async def wait_routed(self, within_s: float = START_TIMEOUT_S) -> None:
        """Until the balancer has bound its port (so whatever answers there is this balancer,
        never another process that took the port) and answers /healthz from a node (HAProxy:
        once its check passed)."""
        assert self.balancer is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        while not await self._bound():
            if self.balancer.returncode is not None:
                raise RuntimeError(f"the balancer exited with {self.balancer.returncode}")
            if loop.time() > deadline:
                raise RuntimeError(f"the balancer did not bind within {within_s:g} s")
            await asyncio.sleep(0.05)
        await wait_http(f"http://{self.spec.host}:{self.port}/healthz", self.balancer)

    async def rolling_restart(self, settle_s: float = 1.5) -> None:
        """Each node in turn: SIGTERM (drain, DRAIN-1..3), exit, start on the same port, then
        ``settle_s`` for the balancer's health check to route to it again (DRAIN-5)."""
        for node in self.nodes:
            await node.stop()
            await node.start()
            await asyncio.sleep(settle_s)

    async def stop(self) -> None:
        """Nodes first (they drain), then the balancer, then the Redis started here."""
        await asyncio.gather(*(node.stop() for node in self.nodes))
        balancer, self.balancer = self.balancer, None
        await _terminate(balancer)
        redis, self.redis = self.redis, None
        await _terminate(redis)


def shared_key_args(workdir: Path, serve_args: Sequence[str]) -> list[str]:
    """Every node seals reasoning with one key (SEAL-5): unless the serve flags name a key
    file, ``WORKDIR/reasoning.key`` (made once, mode 0600, kept across restarts)."""
    if any(a.split("=", 1)[0] == "--reasoning-key-file" for a in serve_args):
        return []
    path = workdir / "reasoning.key"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(os.urandom(32).hex() + "\n")
    return ["--reasoning-key-file", str(path)]


def _binary(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin")
    if found is None:
        raise RuntimeError(f"{name} is missing: `make sysdeps` installs it")
    return found


def render_balancer(kind: str, host: str, port: int, servers: Sequence[str], workdir: Path) -> Path:
    """``deploy/haproxy.cfg.in`` or ``deploy/nginx.conf.in`` with the addresses filled in,
    written into ``workdir`` (nginx's temp folders too)."""
    if kind == "nginx":
        for temp in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (workdir / temp).mkdir(parents=True, exist_ok=True)
    out = workdir / ("haproxy.cfg" if kind == "haproxy" else "nginx.conf")
    out.write_text(balancer_config(kind, host, port, servers, workdir))
    return out


def node_id(index: int) -> str:
    """Node ``index``'s ``--node-id``, the name its turn-state tokens carry (TURN-1) and the
    balancer's name for it (PARK-8)."""
    return f"node{index}"


def balancer_config(kind: str, host: str, port: int, servers: Sequence[str], workdir: Path) -> str:
    """The template's text for these nodes (``host:port`` each, node ``i`` named ``node_id(i)``).
    ``deploy/haproxy-compose.cfg`` is this for the compose file's services (a test keeps the
    two equal)."""
    if kind == "haproxy":
        parts = _haproxy_parts(servers)
        template = DEPLOY / "haproxy.cfg.in"
    else:
        parts = _nginx_parts(servers)
        template = DEPLOY / "nginx.conf.in"
    text = template.read_text()
    for name, value in {
        "@PORT@": str(port), "@BIND@": host, **parts,
        "@DIR@": str(workdir), "@STATS@": str(workdir / "haproxy.sock"),
    }.items():  # fmt: skip
        text = text.replace(name, value)
    return text


def _haproxy_parts(servers: Sequence[str]) -> dict[str, str]:
    """One ``use-server`` rule per node on its turn-state token's node field, one ``server``."""
    names = [node_id(i) for i in range(len(servers))]
    sticky = [
        f"    use-server {n} if {{ req.hdr(x-codex-turn-state),field(2,.) -m str {n} }}"
        for n in names
    ]
    lines = [f"    server {n} {a}" for n, a in zip(names, servers, strict=True)]
    return {"@STICKY@": "\n".join(sticky), "@SERVERS@": "\n".join(lines)}


def _nginx_parts(servers: Sequence[str]) -> dict[str, str]:
    """The balanced pool (least_conn), a turn-state route per node, and per node an upstream
    that is that node first and the others as backups (a token naming a failed node still
    gets served)."""
    names = [node_id(i) for i in range(len(servers))]
    opts = "max_fails=1 fail_timeout=2s"
    pool = [f"        server {a} {opts};" for a in servers]
    routes = [f"        ~^rts1\\.{n}\\. {n};" for n in names]
    upstreams: list[str] = []
    for n, own in zip(names, servers, strict=True):
        others = [f"        server {a} {opts} backup;" for a in servers if a != own]
        # No keepalive pool, as the balanced pool (RETRY-3, deploy/nginx.conf.in).
        upstreams += [f"    upstream {n} {{", f"        server {own} {opts};", *others,
                      "    }"]  # fmt: skip
    return {
        "@SERVERS@": "\n".join(pool),
        "@TURN_ROUTES@": "\n".join(routes),
        "@NODE_UPSTREAMS@": "\n".join(upstreams),
    }


Reply = Callable[[asyncio.StreamReader], Awaitable[bytes]]


async def _first_bytes(reader: asyncio.StreamReader) -> bytes:
    return await reader.read(4096)


async def _ask(
    opening: Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]],
    request: bytes,
    reply: Reply = _first_bytes,
) -> bytes:
    """Send ``request`` on a new connection and read its ``reply`` (2 s at most); b"" when
    nobody answers."""
    try:
        reader, writer = await opening
    except OSError:
        return b""
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reply(reader), 2)
    except (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError):
        return b""
    finally:
        writer.close()


async def _redis_answers(port: int) -> bool:
    return b"+PONG" in await _ask(asyncio.open_connection("127.0.0.1", port), b"PING\r\n")


async def _bulk_string(reader: asyncio.StreamReader) -> bytes:
    """A RESP bulk string: ``$<length>``, then that many bytes."""
    head = await reader.readline()
    if not head.startswith(b"$") or int(head[1:]) < 0:
        return b""
    return await reader.readexactly(int(head[1:]))


async def redis_pid(port: int) -> int | None:
    """The process id of the Redis answering on ``port`` (``INFO``), or None, also while it is
    still loading its data (``loading:1``): it answers every command but ``INFO`` with
    ``-LOADING`` until then."""
    opening = asyncio.open_connection("127.0.0.1", port)
    pid = None
    for line in (await _ask(opening, b"INFO\r\n", _bulk_string)).splitlines():
        if line.startswith(b"process_id:"):
            pid = int(line.split(b":", 1)[1])
        elif line.strip() == b"loading:1":
            return None
    return pid


async def _foreground(spec: ClusterSpec, announce: bool) -> int:
    """Start, print where, then wait: SIGINT/SIGTERM stop everything, SIGHUP rolls the nodes,
    a child that exits unasked is restarted (CLUSTER-15)."""
    cluster = Cluster(spec)
    loop = asyncio.get_running_loop()
    stop, roll = asyncio.Event(), asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, roll.set)
    try:
        await cluster.start()
    except RuntimeError as exc:
        print(f"rollout cluster: {exc}", file=sys.stderr)
        return 2
    _banner(cluster)
    if announce:
        print(f"PORT {cluster.port}", flush=True)
    try:
        return await _supervise(cluster, stop, roll)
    finally:
        await cluster.stop()
        print("rollout cluster: stopped", flush=True)


async def _supervise(cluster: Cluster, stop: asyncio.Event, roll: asyncio.Event) -> int:
    """Until SIGINT/SIGTERM: SIGHUP rolls the nodes (DRAIN-5); a child that exits unasked is
    restarted after its back-off (CLUSTER-15), each on its own, while the others keep serving
    and are watched (a node slow to start does not hold up a crashed Redis)."""
    keeper = Restarts()
    restarting: dict[asyncio.Future[object], str] = {}
    while not stop.is_set():
        waiters: dict[asyncio.Future[object], str] = {
            asyncio.ensure_future(stop.wait()): "stop",
            asyncio.ensure_future(roll.wait()): "roll",
            asyncio.ensure_future(_first_exit(cluster, set(restarting.values()))): "exit",
        }
        done, pending = await asyncio.wait(
            [*waiters, *restarting], return_when=asyncio.FIRST_COMPLETED
        )
        for task in pending:
            if task in waiters:
                task.cancel()
        await asyncio.gather(*(t for t in pending if t in waiters), return_exceptions=True)
        for task in done:
            restarting.pop(task, None)
        if stop.is_set():
            break
        if roll.is_set() and not restarting:
            roll.clear()
            print("rollout cluster: rolling restart", flush=True)
            await cluster.rolling_restart()
            print("rollout cluster: rolling restart done", flush=True)
            continue
        for task in done:
            if waiters.get(task) == "exit" and isinstance(name := task.result(), str):
                restart: asyncio.Future[object] = asyncio.ensure_future(
                    keeper.restart(cluster, name, stop)
                )
                restarting[restart] = name
    for task in restarting:
        task.cancel()
    await asyncio.gather(*restarting, return_exceptions=True)
    return 0


def _children(cluster: Cluster) -> dict[str, asyncio.subprocess.Process]:
    """The running children by name: ``node<i>``, ``balancer``, ``redis`` (if started here)."""
    named = {node_id(n.index): n.proc for n in cluster.nodes}
    named |= {"balancer": cluster.balancer, "redis": cluster.redis}
    return {name: proc for name, proc in named.items() if proc is not None}


async def _first_exit(cluster: Cluster, skip: set[str]) -> str | None:
    """The name of the first child to exit, of those not being restarted (``skip``)."""
    children = {k: v for k, v in _children(cluster).items() if k not in skip}
    waits = {asyncio.ensure_future(p.wait()): name for name, p in children.items()}
    if not waits:
        await asyncio.Event().wait()  # nothing to watch: only a signal ends this
    try:
        done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
    return waits[next(iter(done))]


@dataclass
class Restarts:
    """CLUSTER-15: each child's back-off, doubled by a restart that did not stay up."""

    delay: dict[str, float] = field(default_factory=dict)
    started: dict[str, float] = field(default_factory=dict)

    async def restart(self, cluster: Cluster, name: str, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        proc = _children(cluster).get(name)
        code = proc.returncode if proc is not None else None
        if loop.time() - self.started.get(name, -STABLE_S) >= STABLE_S:
            self.delay[name] = RESTART_FIRST_S  # it had stayed up: start over
        delay = self.delay.get(name, RESTART_FIRST_S)
        self.delay[name] = min(RESTART_MAX_S, delay * 2)
        print(
            f"rollout cluster: {name} exited ({code}); restarting in {delay:g} s",
            file=sys.stderr, flush=True,
        )  # fmt: skip
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)  # a signal meanwhile: no restart
        if stop.is_set():
            return
        self.started[name] = loop.time()
        try:
            await _start_child(cluster, name)
        except RuntimeError as exc:  # it failed again: the next round waits longer
            print(f"rollout cluster: {name}: {exc}", file=sys.stderr, flush=True)
            return
        proc = _children(cluster).get(name)
        print(f"rollout cluster: {name} restarted (pid {proc.pid if proc else '-'})", flush=True)


async def _start_child(cluster: Cluster, name: str) -> None:
    if name == "redis":
        cluster.redis = None
        await cluster.start_redis()
    elif name == "balancer":
        await cluster.respawn_balancer()
    else:
        node = next(n for n in cluster.nodes if node_id(n.index) == name)
        await node.start(RESTART_TIMEOUT_S)


def _banner(cluster: Cluster) -> None:
    spec = cluster.spec
    redis = f" (redis-server pid {cluster.redis.pid}, started here)" if cluster.redis else ""
    nodes = ", ".join(
        f"127.0.0.1:{n.port} (pid {n.proc.pid if n.proc else '-'})" for n in cluster.nodes
    )
    print(
        f"rollout cluster on {cluster.url} ({spec.balancer}, {spec.nodes} nodes)\n"
        f"  nodes:     {nodes}\n"
        f"  balancer:  {spec.balancer} (pid {cluster.balancer.pid if cluster.balancer else '-'})\n"
        f"  store:     {spec.store}{redis}\n"
        f"  logs:      {spec.workdir}\n"
        f"  Ctrl-C stops everything; kill -HUP <this pid> restarts the nodes one by one",
        flush=True,
    )
