"""``rollout serve``: flags, configuration and the serving loop (the server side of ``rollout``).

The ``rollout`` command itself is ``cli.main``, the one module that sees both sides; ``agent``
and ``bench`` are clients (``clients.demo``, ``clients.bench``) and are not imported here.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import ssl
import sys
from collections.abc import Callable
from pathlib import Path

from aiohttp import web

from engine.core import Engine, EngineConfig
from engine.models.router import Router
from engine.server.config import ServerConfig, load_api_keys, warn_if_open
from engine.server.keys import ENGINE, UNREADY
from engine.server.turn_state import check_node_id, default_node_id
from engine.server.workers import (
    WORKER_FLAG,
    follow_parent,
    report_listening,
    reserve_port,
    run_workers,
)
from engine.store import (
    DEFAULT_MAX_RECORD_BYTES,
    DEFAULT_TTL_S,
    ResponseStore,
    StoreError,
    default_store_url,
    describe,
    open_store,
)
from engine.store.sqlite import SqliteStore


def add_serve_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serve", help="run the Responses API server (simulated model by default)")
    net = p.add_argument_group("network")
    net.add_argument("--host", default="127.0.0.1")
    net.add_argument("--port", type=int, default=8000)
    net.add_argument("--tls-cert", type=Path, default=None, help="PEM certificate: serve https/wss")
    net.add_argument("--tls-key", type=Path, default=None, help="PEM private key for --tls-cert")
    net.add_argument("--api-keys-file", type=Path, default=None, help="one API key per line")
    net.add_argument(
        "--api-keys-env", default="ROLLOUT_API_KEYS", help="env var with comma-separated API keys"
    )
    net.add_argument("--no-websocket", action="store_true", help="answer upgrades with 426")
    net.add_argument(
        "--node-id",
        type=check_node_id,
        default=None,
        help="this node's name in x-codex-turn-state (default: the host name), [A-Za-z0-9_-]",
    )
    net.add_argument("--backlog", type=int, default=128, help="listen queue of pending connects")
    net.add_argument(
        "--announce-port",
        action="store_true",
        help="once listening, print 'PORT <n>' on stdout (the bound port, for --port 0)",
    )
    lim = p.add_argument_group("limits")
    lim.add_argument("--max-connections", type=int, default=1024, help="open WebSockets")
    lim.add_argument("--max-frame-bytes", type=int, default=32 * 1024 * 1024)
    lim.add_argument("--max-connection-age", type=float, default=3600.0, help="seconds")
    lim.add_argument("--idle-timeout", type=float, default=600.0, help="suspended rollout, s")
    lim.add_argument("--max-queued", type=int, default=16, help="queued creates per lane")
    lim.add_argument(
        "--max-queued-bytes", type=int, default=64 * 1024 * 1024,
        help="bytes of create frames queued per connection",
    )  # fmt: skip
    lim.add_argument("--max-lanes", type=int, default=32, help="named stream_ids per connection")
    lim.add_argument("--max-input-items", type=int, default=10_000, help="items per request")
    lim.add_argument("--max-input-chars", type=int, default=8_000_000, help="text per request")
    lim.add_argument("--model-timeout", type=float, default=600.0, help="one sampling step, s")
    lim.add_argument("--send-timeout", type=float, default=30.0, help="slow reader cut-off, s")
    lim.add_argument("--shutdown-grace", type=float, default=10.0, help="in-flight drain, s")
    lim.add_argument(
        "--drain-delay", type=float, default=0.0,
        help="after SIGTERM, fail /healthz but keep serving this long before draining, s",
    )  # fmt: skip
    lim.add_argument(
        "--store-max-entries", type=int, default=10_000, help="stored responses (memory://)"
    )
    st = p.add_argument_group("store")
    st.add_argument(
        "--store",
        default=None,
        metavar="URL",
        help="sqlite:///PATH (default: ~/.local/share/rollout/rollout.db), redis://HOST:PORT/DB, "
        "rediss://…, memory://",
    )
    st.add_argument(
        "--store-ttl",
        type=duration,
        default=DEFAULT_TTL_S,
        metavar="AGE",
        help="retention of stored responses: seconds or 90s/45m/12h/30d; 0 = forever (30d)",
    )
    st.add_argument(
        "--store-max-record-bytes",
        type=int,
        default=DEFAULT_MAX_RECORD_BYTES,
        help="largest stored response record",
    )
    lim.add_argument(
        "--park-seconds", type=float, default=60.0,
        help="a suspended rollout outlives its closed WebSocket this long (0: off)",
    )  # fmt: skip
    lim.add_argument(
        "--hydration-cache-bytes", type=int, default=256 * 1024 * 1024,
        help="per-process cache of recent stored contexts, in bytes (0: off)",
    )  # fmt: skip
    proc = p.add_argument_group("processes")
    proc.add_argument(
        "--workers", type=int, default=1,
        help="server processes sharing the port (SO_REUSEPORT) and the store",
    )  # fmt: skip
    proc.add_argument(WORKER_FLAG, type=int, default=None, help=argparse.SUPPRESS)
    eng = p.add_argument_group("engine")
    eng.add_argument("--tps", type=float, default=1000.0, help="simulated model tokens/second")
    eng.add_argument("--safety-policy", choices=["flag", "redact"], default="flag")
    eng.add_argument("--ledger", type=Path, default=None, help="append usage records (JSONL)")
    eng.add_argument("--log-level", default="INFO")
    up = p.add_argument_group("models")
    up.add_argument("--config", type=Path, default=None, help="model routing file (TOML)")
    up.add_argument("--upstream", default=None, help="OpenAI-compatible base URL, e.g. …/v1")
    up.add_argument("--upstream-model", default=None, help="model name sent upstream")
    up.add_argument("--upstream-key-env", default=None, help="env var holding the upstream key")
    up.add_argument(
        "--bench-models",
        action="store_true",
        help="add the benchmark's models (bench-coding-agent/N, bench-text/N) to the simulator",
    )
    up.add_argument(
        "--bench-timings",
        action="store_true",
        help="record per-turn stage timings, served at GET /v1/bench/timings (benchmark only)",
    )


def engine_config(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        tokens_per_second=args.tps,
        max_connection_age_s=args.max_connection_age,
        suspended_idle_timeout_s=args.idle_timeout,
        max_queued_creates=args.max_queued,
        max_queued_bytes=args.max_queued_bytes,
        max_lanes=args.max_lanes,
        max_input_items=args.max_input_items,
        max_input_chars=args.max_input_chars,
        store_max_entries=args.store_max_entries,
        store_ttl_s=args.store_ttl,
        model_timeout_s=args.model_timeout,
        ledger_path=args.ledger,
        safety_policy=args.safety_policy,
        bench_timings=args.bench_timings,
        park_seconds=args.park_seconds,
        hydration_cache_bytes=args.hydration_cache_bytes,
    )


def server_config(args: argparse.Namespace) -> ServerConfig:
    return ServerConfig(
        max_frame_bytes=args.max_frame_bytes,
        max_connections=args.max_connections,
        websocket_enabled=not args.no_websocket,
        api_keys=load_api_keys(args.api_keys_file, args.api_keys_env),
        send_timeout_s=args.send_timeout,
        shutdown_grace_s=args.shutdown_grace,
        node_id=args.node_id or default_node_id(),
        drain_delay_s=args.drain_delay,
    )


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

    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    if args.workers > 1 and args.worker_index is None:
        return _serve_workers(args)
    config = engine_config(args)
    try:
        router = _router(args, config)
        tls = tls_context(args.tls_cert, args.tls_key)
        server = server_config(args)
        store = response_store(args)
    except (ValueError, OSError) as exc:
        print(f"rollout serve: {exc}", file=sys.stderr)
        return 2
    warn_if_open(server, args.host)
    app = create_app(Engine(config, router=router, store=store), server=server)
    if args.worker_index is not None:
        follow_parent()
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(_run_app(app, args, tls, server, router))
    except (web.GracefulExit, KeyboardInterrupt):
        pass  # SIGTERM/SIGINT: the app has drained and closed (LIM-13); a clean exit
    except StoreError as exc:  # e.g. a SQLite file that is not a database, a newer schema
        print(f"rollout serve: store: {exc}", file=sys.stderr)
        return 2
    return 0


def _serve_workers(args: argparse.Namespace) -> int:
    """The parent of ``--workers N`` (WORK-1): checks what it can, then only supervises."""
    try:
        _router(args, engine_config(args))
        tls_context(args.tls_cert, args.tls_key)
        store = response_store(args)  # each worker opens its own connection to it
        port = reserve_port(args.host, args.port)
    except (ValueError, OSError) as exc:
        print(f"rollout serve: {exc}", file=sys.stderr)
        return 2
    with port:
        number = port.getsockname()[1]
        _banner(args, number, None, args.tls_cert is not None, store)
        print(f"  workers:   {args.workers} processes on port {number} (SO_REUSEPORT)", flush=True)

        def announce() -> None:  # once every worker listens: a client may connect at once
            if args.announce_port:
                print(f"PORT {number}", flush=True)

        # The workers get the parent's own serve arguments (``cli.main`` parsed them from
        # sys.argv), with the port made concrete.
        argv = [*sys.argv[sys.argv.index("serve") + 1 :], "--port", str(number)]
        return run_workers(argv, args.workers, announce)


def response_store(args: argparse.Namespace) -> ResponseStore:
    """The store named by ``--store`` (STORE-10); a SQLite file's folder is created here, so a
    bad path is an operator error at start, not a failure of the first request."""
    url = args.store or default_store_url()
    store = open_store(
        url,
        ttl_s=args.store_ttl,
        max_record_bytes=args.store_max_record_bytes,
        max_entries=args.store_max_entries,
    )
    if isinstance(store, SqliteStore):
        store.path.parent.mkdir(parents=True, exist_ok=True)
    return store


def duration(text: str) -> float:
    """``3600``, ``90s``, ``45m``, ``12h`` or ``30d`` as seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    scale = units.get(text[-1:].lower(), 0)
    try:
        value = float(text[:-1] if scale else text) * (scale or 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("a duration is not negative")
    return value


def _banner(
    args: argparse.Namespace, port: int, router: Router | None, tls: bool, store: ResponseStore
) -> None:
    http, ws = ("https", "wss") if tls else ("http", "ws")
    base = f"{http}://{args.host}:{port}/v1"
    models = ", ".join(router.models()) if router else f"simulated, {args.tps:g} tokens/s"
    print(
        f"rollout engine on {base} (models: {models})\n"
        f"  HTTP:      POST {base}/responses\n"
        f"  WebSocket: {ws}://{args.host}:{port}/v1/responses\n"
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


def _router(args: argparse.Namespace, config: EngineConfig) -> Router | None:
    """Routes from ``--config`` or the ``--upstream`` shortcut; None keeps the simulator.
    Raises ``ValueError`` (``ConfigError`` included) with a message for the operator."""
    if args.bench_models:
        if args.config is not None or args.upstream is not None:
            raise ValueError("--bench-models serves the simulator only: drop --config/--upstream")
        from engine.models.bench_models import bench_router

        return bench_router(args.tps)
    if args.config is None and args.upstream is None:
        return None
    from engine.models.config import build_router, load_config, shortcut_config

    if args.config is not None and args.upstream is not None:
        raise ValueError("use either --config or --upstream, not both")
    if args.config is not None:
        routing = load_config(args.config)
    else:
        routing = shortcut_config(args.upstream, args.upstream_model, args.upstream_key_env)
    if routing.default is not None:
        config.default_model = routing.default
    return build_router(routing)


async def _run_app(
    app: web.Application,
    args: argparse.Namespace,
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
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=server.shutdown_grace_s)
    await runner.setup()
    # Workers of one pool share the port; the kernel spreads connections over them (WORK-1).
    worker = args.worker_index is not None
    site = web.TCPSite(
        runner, args.host, args.port, ssl_context=tls, backlog=args.backlog, reuse_port=worker
    )
    await site.start()
    port = runner.addresses[0][1]  # the bound one: --port 0 picks a free port
    if worker:
        report_listening()  # the parent announces the pool's port once all listen (WORK-1)
    else:  # a pool's parent has said all this for its workers
        _banner(args, port, router, tls is not None, app[ENGINE].store)
        if args.announce_port:
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
