"""``rollout`` command line: ``serve`` and ``agent``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from engine.core import Engine, EngineConfig
from engine.models.router import Router


def _serve_args(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serve", help="run the Responses API server (simulated model by default)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--tps", type=float, default=1000.0, help="simulated model tokens/second")
    p.add_argument("--max-connection-age", type=float, default=3600.0, help="seconds")
    p.add_argument("--idle-timeout", type=float, default=600.0, help="suspended rollout, seconds")
    p.add_argument("--max-queued", type=int, default=16, help="queued creates per lane")
    p.add_argument("--max-frame-bytes", type=int, default=32 * 1024 * 1024)
    p.add_argument("--ledger", type=Path, default=None, help="append usage records (JSONL)")
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--config", type=Path, default=None, help="model routing file (TOML)")
    p.add_argument("--upstream", default=None, help="OpenAI-compatible base URL, e.g. …/v1")
    p.add_argument("--upstream-model", default=None, help="model name sent upstream")
    p.add_argument("--upstream-key-env", default=None, help="env var holding the upstream key")


def _agent_args(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("agent", help="run the demo coding agent against a server")
    p.add_argument("--url", default="http://127.0.0.1:8000/v1")
    p.add_argument(
        "--mode", choices=["append", "ws", "http"], default="append", help="client transport"
    )
    p.add_argument("--model", default="sim-coding-agent")
    p.add_argument("--quiet", action="store_true")


def serve(args: argparse.Namespace) -> int:
    from aiohttp import web

    from engine.server.app import create_app

    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    config = EngineConfig(
        tokens_per_second=args.tps,
        max_connection_age_s=args.max_connection_age,
        suspended_idle_timeout_s=args.idle_timeout,
        max_queued_creates=args.max_queued,
        ledger_path=args.ledger,
    )
    try:
        router = _router(args, config)
    except ValueError as exc:
        print(f"rollout serve: {exc}", file=sys.stderr)
        return 2
    app = create_app(Engine(config, router=router), max_frame_bytes=args.max_frame_bytes)
    base = f"http://{args.host}:{args.port}/v1"
    models = ", ".join(router.models()) if router else f"simulated, {args.tps:g} tokens/s"
    print(
        f"rollout engine on {base} (models: {models})\n"
        f"  HTTP:      POST {base}/responses\n"
        f"  WebSocket: ws://{args.host}:{args.port}/v1/responses\n"
        f"  openai SDK: AsyncOpenAI(base_url='{base}', api_key='any')\n"
        f"  demo agent: rollout agent --url {base}",
        flush=True,
    )
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - non-POSIX
        loop_factory = None
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(_run_app(web, app, args.host, args.port))
    return 0


def _router(args: argparse.Namespace, config: EngineConfig) -> Router | None:
    """Routes from ``--config`` or the ``--upstream`` shortcut; None keeps the simulator.
    Raises ``ValueError`` (``ConfigError`` included) with a message for the operator."""
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


async def _run_app(web: object, app: object, host: str, port: int) -> None:
    from aiohttp import web as aioweb

    assert isinstance(app, aioweb.Application)
    runner = aioweb.AppRunner(app, handle_signals=True)
    await runner.setup()
    site = aioweb.TCPSite(runner, host, port)
    await site.start()
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def agent(args: argparse.Namespace) -> int:
    from clients.demo import run_demo

    return asyncio.run(run_demo(args.url, mode=args.mode, model=args.model, quiet=args.quiet))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rollout", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_args(sub)
    _agent_args(sub)
    args = parser.parse_args(argv)
    if args.command == "serve":
        return serve(args)
    return agent(args)


if __name__ == "__main__":
    sys.exit(main())
