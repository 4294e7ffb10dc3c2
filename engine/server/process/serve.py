"""``rollout serve``: build the configs from the flags (``flags.py``), then serve until a signal.

The ``rollout`` command itself is ``cli.main``, the one module that sees both sides; ``agent``
and ``bench`` are clients (``clients.demo``, ``clients.bench``) and are not imported here.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import shutil
import signal
import socket
import ssl
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from aiohttp import web

from engine.conversation.sealed import KeyRing, warn_ephemeral
from engine.core import Engine, EngineConfig
from engine.models.router import Router
from engine.server.process.flags import ServeOptions, engine_config, serve_options, server_config
from engine.server.process.workers import (
    follow_parent,
    report_listening,
    reserve_port,
    run_workers,
)
from engine.server.transport import bodies
from engine.server.transport.access_log import RedactingAccessLogger
from engine.server.transport.keys import ENGINE, UNREADY
from engine.server.transport.server_config import ServerConfig, refuse_if_open
from engine.store import ResponseStore, StoreError, default_store_url, describe, open_store
from engine.store.embedded.sqlite import SqliteStore

log = logging.getLogger("rollout.serve")


def tls_context(cert: Path | None, key: Path | None) -> ssl.SSLContext | None:
    """TLS for ``https://`` and ``wss://`` straight from the server (TLS-1)."""
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise ValueError("--tls-cert and --tls-key go together")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context


def serve(args: argparse.Namespace) -> int:
    from engine.server.app import create_app

    options = serve_options(args)
    logging.basicConfig(
        level=options.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    if options.workers > 1 and options.worker_index is None:
        return _serve_workers(args, options)
    try:
        router, default_model = models(options, args.tokens_per_second)
        config = engine_config(args, default_model)  # built once, with the routing's default
        tls = tls_context(options.tls_cert, options.tls_key)
        server = server_config(args)
        refused = refuse_if_open(server, options.host, options.allow_anonymous)
        if refused is not None:
            raise ValueError(refused)
        store = response_store(options, config)
        check_reasoning_keys(config)
        if config.ledger_path is not None:  # a ledger it cannot write stops serve here
            config.ledger_path.open("a", encoding="utf-8").close()
    except (ValueError, OSError) as exc:
        print(f"rollout serve: {exc}", file=sys.stderr)
        return 2
    app = create_app(Engine(config, router=router, store=store), server=server)
    if options.worker_index is not None:
        follow_parent()
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(_run_app(app, options, tls, server, router))
    except (web.GracefulExit, KeyboardInterrupt):
        pass  # SIGTERM/SIGINT: the app has drained and closed (LIM-13); a clean exit
    except StoreError as exc:  # e.g. a SQLite file that is not a database, a newer schema
        print(f"rollout serve: store: {exc}", file=sys.stderr)
        return 2
    except CannotListen as exc:  # --host / --port that cannot be bound: a usage error
        print(f"rollout serve: {exc}", file=sys.stderr)
        return 2
    return 0


class CannotListen(Exception):
    """The address the flags name cannot be listened on (no such host, taken, not ours)."""


def settle_heap() -> None:
    """Once the server listens (ROLL-9): what startup built (modules, codecs, tables) lives as
    long as the process, so the cyclic collector stops walking it on every full pass; the
    garbage startup left goes first."""
    gc.collect()
    gc.freeze()
    log.info("startup heap frozen: %d objects out of the cyclic collector", gc.get_freeze_count())


def check_reasoning_keys(config: EngineConfig) -> None:
    """A key file that cannot be read stops serve before it listens; none: SEAL-5's warning."""
    if config.reasoning_key_file is None:
        warn_ephemeral()
    else:
        KeyRing.from_file(config.reasoning_key_file)


def _serve_workers(args: argparse.Namespace, options: ServeOptions) -> int:
    """The parent of ``--workers N`` (WORK-1): checks what it can, then only supervises."""
    try:
        models(options, args.tokens_per_second)
        tls_context(options.tls_cert, options.tls_key)
        refused = refuse_if_open(server_config(args), options.host, options.allow_anonymous)
        if refused is not None:
            raise ValueError(refused)
        # each worker opens its own connection to it
        store = response_store(options, engine_config(args))
        port = reserve_port(options.host, options.port)
    except (ValueError, OSError) as exc:
        print(f"rollout serve: {exc}", file=sys.stderr)
        return 2
    with port:
        number = port.getsockname()[1]
        _banner(options, number, _simulated(args.tokens_per_second), options.tls_cert, store)
        print(
            f"  workers:   {options.workers} processes on port {number} (SO_REUSEPORT)", flush=True
        )
        if server_config(args).rate_limited and not store.cluster.shares_limits:
            # LIVE-6: only Redis counts for the whole pool; say so before a key finds out.
            print(
                f"rollout serve: warning: rate limits are counted per worker on the {store.kind}"
                f" store: a key may get up to {options.workers} times its limits"
                " (use a redis:// store to count them once)",
                file=sys.stderr,
                flush=True,
            )

        def announce() -> None:  # once every worker listens: a client may connect at once
            if options.announce_port:
                print(f"PORT {number}", flush=True)

        # The workers get the parent's own serve arguments (``cli.main`` parsed them from
        # sys.argv), with the port made concrete.
        argv = [*sys.argv[sys.argv.index("serve") + 1 :], "--port", str(number)]
        with _workers_key(argv, engine_config(args).reasoning_key_file is None) as argv:
            return run_workers(argv, options.workers, announce)


@contextlib.contextmanager
def _workers_key(argv: list[str], ephemeral: bool) -> Iterator[list[str]]:
    """The workers of one port seal reasoning with one key (SEAL-5): without a key file the
    parent makes a random one for them (mode 0600), removed when they stop."""
    if not ephemeral:
        yield argv
        return
    warn_ephemeral()
    folder = tempfile.mkdtemp(prefix="rollout-keys-")
    try:
        path = os.path.join(folder, "reasoning.key")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(os.urandom(32).hex() + "\n")
        yield [*argv, "--reasoning-key-file", path]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def response_store(options: ServeOptions, config: EngineConfig) -> ResponseStore:
    """The store named by ``--store`` (STORE-10); a SQLite file's folder is created here, so a
    bad path is an operator error at start, not a failure of the first request."""
    url = options.store or default_store_url()
    store = open_store(
        url,
        ttl_s=config.store_ttl_s,
        max_record_bytes=options.store_max_record_bytes,
        max_entries=config.store_max_entries,
        max_bytes=config.budget.store,
    )
    if isinstance(store, SqliteStore):
        store.path.parent.mkdir(parents=True, exist_ok=True)
    return store


def advertised(url: str, host: str, port: int, tls: ssl.SSLContext | None) -> str:
    """This node's base URL for its peers (PARK-20): ``--advertise-url``, else the address it
    listens on (a wildcard address: the host name, which peers on its network resolve)."""
    if url:
        return url.rstrip("/")
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    elif ":" in host:
        host = f"[{host}]"
    return f"{'https' if tls else 'http'}://{host}:{port}"


def _simulated(tokens_per_second: float) -> str:
    return f"simulated, {tokens_per_second:g} tokens/s"


def _banner(
    options: ServeOptions, port: int, models: str, tls: object, store: ResponseStore
) -> None:
    http, ws = ("https", "wss") if tls is not None else ("http", "ws")
    base = f"{http}://{options.host}:{port}/v1"
    print(
        f"rollout engine on {base} (models: {models})\n"
        f"  HTTP:      POST {base}/responses\n"
        f"  WebSocket: {ws}://{options.host}:{port}/v1/responses\n"
        f"  openai SDK: AsyncOpenAI(base_url='{base}', api_key='any')\n"
        f"  demo agent: rollout agent --url {base}\n"
        f"  store:     {describe(store)}",
        flush=True,
    )


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop

        factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
        return factory
    except ImportError:  # pragma: no cover - non-POSIX
        return None


def models(options: ServeOptions, tokens_per_second: float) -> tuple[Router | None, str | None]:
    """The router from ``--config`` or the ``--upstream`` shortcut (None keeps the simulator),
    and the routing config's default model, if it names one (CFG-4). Raises ``ValueError``
    (``ConfigError`` included) with a message for the operator."""
    if options.bench_models:
        if options.config is not None or options.upstream is not None:
            raise ValueError("--bench-models serves the simulator only: drop --config/--upstream")
        from engine.models.sim.bench_models import bench_router

        return bench_router(tokens_per_second), None
    if options.config is not None and options.upstream is not None:
        raise ValueError("use either --config or --upstream, not both")
    if options.config is not None:
        from engine.models.config import load_config

        routing = load_config(options.config)
    elif options.upstream is not None:
        from engine.models.config import shortcut_config

        routing = shortcut_config(
            options.upstream, options.upstream_model, options.upstream_key_env
        )
    else:
        return None, None
    from engine.models.config import build_router

    return build_router(routing), routing.default


async def _run_app(
    app: web.Application,
    options: ServeOptions,
    tls: ssl.SSLContext | None,
    server: ServerConfig,
    router: Router | None,
) -> None:
    """Serve until SIGINT/SIGTERM; then fail /healthz for ``--drain-delay`` while still serving
    (DRAIN-2), stop accepting, drain, close (LIM-13).

    The signals only set an event: aiohttp's own handling raises out of the loop, which
    cancels every task at once and would cut in-flight responses."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    runner = web.AppRunner(
        app,
        handle_signals=False,
        shutdown_timeout=server.shutdown_grace_s,
        access_log_class=RedactingAccessLogger,  # no query string reaches the log (AUTH-12)
        **bodies.RUNNER_OPTIONS,  # bodies are decoded by the one bounded reader (HTTP-10)
    )
    await runner.setup()
    # Workers of one pool share the port; the kernel spreads connections over them (WORK-1).
    worker = options.worker_index is not None
    site = web.TCPSite(
        runner,
        options.host,
        options.port,
        ssl_context=tls,
        backlog=options.backlog,
        reuse_port=worker,
    )
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        where = f"{options.host}:{options.port}"
        raise CannotListen(f"cannot listen on {where}: {exc.strerror or exc}") from None
    settle_heap()
    port = runner.addresses[0][1]  # the bound one: --port 0 picks a free port
    if not worker:  # a pool's workers share one address: a hand-over could reach any of them
        app[ENGINE].handover.address = advertised(server.advertise_url, options.host, port, tls)
    if worker:
        report_listening()  # the parent announces the pool's port once all listen (WORK-1)
    else:  # a pool's parent has said all this for its workers
        engine = app[ENGINE]
        names = (
            ", ".join(router.models()) if router else _simulated(engine.config.tokens_per_second)
        )
        _banner(options, port, names, tls, engine.store)
        if options.announce_port:
            print(f"PORT {port}", flush=True)  # read by clients/bench/proc.py
    try:
        await stop.wait()
        app[UNREADY][0] = True  # the balancer's next health check takes this node out (DRAIN-1)
        if server.drain_delay_s > 0:
            stop.clear()  # a second signal skips the rest of the delay
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), server.drain_delay_s)
    finally:
        await runner.cleanup()
