"""The bench's server process: the real engine and aiohttp app, with the bench models routed in.

Run as ``python -m engine.bench.server --tps 1000``: it binds (port 0 picks a free port), prints
``PORT <n>`` on stdout, and serves until SIGINT/SIGTERM. The app, engine, pipeline and
simulator are the production ones (``create_app``, ``Engine``, ``SimulatedModel``); only the
routing table differs from ``rollout serve``: ``bench-coding-agent/N`` and ``bench-text/N`` are
added (``engine.bench.backends``). The bench runs this in a subprocess so the server has its own
interpreter and event loop, exactly as a deployed server would, and its RSS can be read.

aiohttp.web is imported inside functions only: ``engine`` outside ``engine/server`` must not
load it at import time (ARCH-1).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from engine.bench.backends import BenchModels
from engine.core import Engine, EngineConfig
from engine.models.router import Router
from engine.models.sim import SimulatedModel


def bench_engine(tokens_per_second: float, idle_timeout_s: float = 600.0) -> Engine:
    """The production engine with the bench routes (``sim`` and ``sim-coding-agent`` kept)."""
    config = EngineConfig(
        tokens_per_second=tokens_per_second, suspended_idle_timeout_s=idle_timeout_s
    )
    sim = SimulatedModel(tokens_per_second)
    coding = SimulatedModel(tokens_per_second, scenario="coding-agent")
    router = Router(
        routes={"sim": sim, "sim-coding-agent": coding},
        default=BenchModels(tokens_per_second),
        default_name="sim",
    )
    return Engine(config, router=router)


async def serve(host: str, port: int, tokens_per_second: float, idle_timeout_s: float) -> None:
    """Serve until SIGINT/SIGTERM; announce the bound port on stdout first."""
    from aiohttp import web

    from engine.server.app import create_app

    app = create_app(bench_engine(tokens_per_second, idle_timeout_s))
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=2048)
    await site.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    bound = runner.addresses[0][1]
    print(f"PORT {bound}", flush=True)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.bench.server", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--tps", type=float, default=1000.0)
    parser.add_argument("--idle-timeout", type=float, default=600.0)
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(levelname)s %(name)s %(message)s")
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - non-POSIX
        loop_factory = None
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(serve(args.host, args.port, args.tps, args.idle_timeout))
    return 0


if __name__ == "__main__":
    sys.exit(main())
