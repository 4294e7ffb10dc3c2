"""``rollout bench``: flags, and the one entry point that runs the parts asked for.

``add_bench_parser(sub)`` adds the subcommand to ``rollout``'s subparsers; ``run_bench(args)``
runs it. ``python -m clients.bench`` offers the same flags on its own.

Default: the coding-agent scenario at 65, 1,000 and 4,000 tokens/s in all four modes.
``--stream`` and ``--memory`` run those benchmarks instead (add ``--scenario`` to run it too).
Exit status: 0 when every part ran (missed targets are reported, not failures), 1 when the
benchmark itself failed, 2 for bad flags.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from clients.bench import report, table
from clients.bench.lean_wire import BenchError
from clients.bench.progress import RunProgress
from clients.bench.runner import ScenarioConfig, run_scenarios
from clients.bench.scenario import SCRIPT_CALLS
from clients.bench.suites.codex import CODEX_CALLS
from clients.bench.suites.keys_load import run_two_keys
from clients.bench.suites.load import LoadSettings, main_load
from clients.bench.suites.rss import MemorySettings, run_memory
from clients.bench.suites.streaming import StreamSettings, run_stream
from clients.bench.transports import ALL_MODES, MODES, STORE_MODES, WS_COMPRESS


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=None, help="bench a running server (…/v1) instead of its own")
    p.add_argument("--speeds", default="65,1000,4000", help="model tokens/s, comma-separated")
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of modes")
    p.add_argument(
        "--turns", type=int, default=None, help="tool calls per rollout (coding 26, codex 60)"
    )
    p.add_argument("--history-scale", type=int, default=1, help="tool output size multiplier")
    p.add_argument("--tool-latency", type=float, default=0.0, help="simulated tool time, ms")
    p.add_argument("--repeat", type=int, default=3, help="runs per mode and speed (medians)")
    p.add_argument(
        "--store",
        default=None,
        help="the server's store: memory (default), sqlite, redis, postgres or a URL; "
        "adds the ws_compat_store mode (store: true)",
    )
    p.add_argument(
        "--quick", action="store_true", help="1,000 tokens/s only (the 26-call scenario)"
    )
    p.add_argument("--stream", action="store_true", help="streaming throughput benchmark")
    p.add_argument("--memory", action="store_true", help="suspended-rollout memory benchmark")
    p.add_argument(
        "--scenario",
        nargs="?",
        const="coding",
        default=None,
        choices=("coding", "codex"),
        help="coding (default) or codex (15 KB instructions, 12 tools, 60 calls, 100k+ tokens); "
        "with --stream/--memory: run it too",
    )
    p.add_argument(
        "--otel-endpoint",
        default=None,
        help="the bench's server exports traces to this OTLP/HTTP collector (what tracing costs)",
    )
    p.add_argument(
        "--ws-compress",
        action="store_true",
        help="WebSocket modes offer permessage-deflate, as Codex does (CODEX-25)",
    )
    p.add_argument("--json", type=Path, default=None, help="write results as JSON")
    p.add_argument("--png", type=Path, default=None, help="plot per-turn overhead (PNG)")
    p.add_argument("--stream-connections", type=int, default=32)
    p.add_argument("--stream-seconds", type=float, default=8.0)
    p.add_argument("--stream-tokens", type=int, default=20_000, help="single-connection answer")
    p.add_argument("--memory-rollouts", type=int, default=1000)
    p.add_argument("--memory-tokens", type=int, default=10_000, help="history per rollout")
    p.add_argument("--memory-lanes", type=int, default=25, help="rollouts per connection (≤32)")
    p.add_argument(
        "--upstream-kind",
        default=None,
        help="chat,tokens,harmony: the codex scenario through a chat, a tokens and a gpt-oss "
        "harmony route against one loopback upstream, side by side (BENCH-9); --turns sets the "
        "turns (default 60)",
    )
    p.add_argument(
        "--peers", action="store_true",
        help="this engine (a responses and a chat route), agentic-api, smg and the LiteLLM proxy "
        "side by side before one instant stub upstream, the same tool chain on every transport "
        "(BENCH-10; pip install -e '.[peers]')",
    )  # fmt: skip
    p.add_argument(
        "--peers-targets", default="engine,engine-chat,agentic-api,smg,litellm",
        help="with --peers: which servers",
    )  # fmt: skip
    p.add_argument(
        "--peers-upstream", default="responses", choices=("responses", "chat"),
        help="with --peers: the route of the target 'engine' to the stub (engine-chat: chat)",
    )  # fmt: skip
    p.add_argument(
        "--peers-transports", default="ws,http_previous_id,http_stateless",
        help="with --peers: which transports",
    )  # fmt: skip
    p.add_argument(
        "--peers-profile", type=Path, default=None,
        help="with --peers: run the engine under py-spy record --native --format raw into this "
        "file (BENCH-11; its CPU figures then include the profiler)",
    )  # fmt: skip
    p.add_argument(
        "--peers-callgrind", action="store_true",
        help="with --peers: run the engine, agentic-api and smg under valgrind's callgrind and "
        "report instructions per turn, a count that does not move with the machine's load "
        "(BENCH-12)",
    )  # fmt: skip
    p.add_argument(
        "--callgrind", action="store_true",
        help="with --scenario: run the bench's own server under valgrind's callgrind and report "
        "each mode's instructions per model turn, counted from its own turns (BENCH-13)",
    )  # fmt: skip
    p.add_argument("--load", action="store_true", help="load test: WS agents + HTTP (LOAD-1)")
    p.add_argument("--load-connections", type=int, default=200)
    p.add_argument("--load-turns", type=int, default=20, help="tool-call turns per connection")
    p.add_argument("--load-http-clients", type=int, default=8)
    p.add_argument(
        "--load-resume", action="store_true",
        help="store: true agents that reconnect at a drain; acknowledged ids read back (LOAD-2)",
    )  # fmt: skip
    p.add_argument("--client-processes", type=int, default=1, help="split the load client (LOAD-3)")
    p.add_argument(
        "--load-two-keys",
        type=int,
        default=0,
        metavar="FLOODERS",
        help="with --load: FLOODERS clients flood with a rate-limited key while the agents run "
        "with a second key; their p99 alone and flooded (RATE-9)",
    )
    p.add_argument(
        "--load-api-key", default=None, help="with --url: send every request with this key"
    )
    p.add_argument(
        "--chaos", action="store_true",
        help="faults under load: rollout cluster (2 nodes, HAProxy, Redis AOF), a node killed -9 "
        "every --chaos-interval s, Redis restarted once; acknowledged ids read back (CHAOS-1)",
    )  # fmt: skip
    p.add_argument("--chaos-seconds", type=float, default=90.0, help="the chaos run's load, s")
    p.add_argument("--chaos-interval", type=float, default=20.0, help="between node kills, s")
    p.add_argument(
        "--soak", action="store_true",
        help="the cluster as one server over time: rollout cluster under mixed openai-SDK "
        "traffic (background runs cancelled and followed, parked rollouts continued, WS and "
        "HTTP chains, SSE) from fresh connections; errors, RSS, read-back (LIVE-9)",
    )  # fmt: skip
    p.add_argument("--soak-seconds", type=float, default=600.0, help="the soak's duration, s")
    p.add_argument(
        "--soak-kill-interval", type=float, default=0.0,
        help="with --soak: kill -9 a node every this many seconds (0: none, CHAOS-1's schedule)",
    )  # fmt: skip
    p.add_argument(
        "--server-pid", type=int, action="append", default=[],
        help="with --url: a server process whose CPU time to read (repeat per node, LOAD-3)",
    )  # fmt: skip


def add_bench_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    p = sub.add_parser("bench", help="benchmark the four transport modes (see README)")
    add_arguments(p)
    return p


def scenario_config(args: argparse.Namespace) -> ScenarioConfig:
    speeds = [1000.0] if args.quick else [float(s) for s in args.speeds.split(",") if s]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if args.store is not None:
        modes += [m for m in STORE_MODES if m not in modes]
    unknown = [m for m in modes if m not in ALL_MODES]
    if unknown or not modes or not speeds:
        raise ValueError(f"bad --modes/--speeds (modes are {', '.join(ALL_MODES)})")
    if args.store is not None and args.url is not None:
        raise ValueError("--store chooses the bench's own server's store: not with --url")
    if args.callgrind and args.url is not None:
        raise ValueError("--callgrind counts the bench's own server: not with --url")
    WS_COMPRESS[0] = 15 if args.ws_compress else 0
    scenario = args.scenario or "coding"
    turns = args.turns or (CODEX_CALLS if scenario == "codex" else SCRIPT_CALLS)
    if turns < 1 or args.history_scale < 1 or args.repeat < 1:
        raise ValueError("--turns, --history-scale and --repeat must be at least 1")
    return ScenarioConfig(
        speeds=speeds,
        modes=modes,
        tool_calls=turns,
        scenario=scenario,
        history_scale=args.history_scale,
        tool_latency_s=args.tool_latency / 1000.0,
        repeat=args.repeat,
        url=args.url,
        store=args.store or "memory",
        otel_endpoint=args.otel_endpoint,
        callgrind=args.callgrind,
    )


def _settings(args: argparse.Namespace, config: ScenarioConfig | None) -> dict[str, Any]:
    return {
        "speeds": config.speeds if config else [],
        "modes": config.modes if config else [],
        "tool_calls": config.tool_calls if config else None,
        "model": config.model if config else None,
        "scenario": config.scenario if config else None,
        "history_scale": args.history_scale,
        "tool_latency_ms": args.tool_latency,
        "repeat": config.repeat if config else None,
        "server": args.url or "subprocess: rollout serve --bench-models",
        "store": config.store if config else None,
        "stream": bool(args.stream),
        "memory": bool(args.memory),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "loadavg_at_start": list(os.getloadavg()),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


async def _run(args: argparse.Namespace, config: ScenarioConfig | None) -> dict[str, Any]:
    doc: dict[str, Any] = {"settings": _settings(args, config), "runs": []}
    targets: list[dict[str, Any]] = []
    if config is not None:
        with RunProgress(len(config.speeds) * len(config.modes) * config.repeat) as progress:
            doc["runs"] = await run_scenarios(config, progress)
        doc["summary"] = report.summarize(doc["runs"])
        targets += report.scenario_targets(doc["summary"])
    if args.stream:
        print("streaming benchmark …", file=sys.stderr, flush=True)
        doc["stream"] = await run_stream(_stream_settings(args), args.url)
        targets += report.stream_targets(doc["stream"])
    if args.memory:
        print("memory benchmark …", file=sys.stderr, flush=True)
        doc["memory"] = await run_memory(_memory_settings(args), args.url)
        targets += report.memory_targets(doc["memory"])
    doc["targets"] = targets
    return report.clean(doc)  # type: ignore[no-any-return]


def _stream_settings(args: argparse.Namespace) -> StreamSettings:
    return StreamSettings(
        single_tokens=args.stream_tokens,
        connections=args.stream_connections,
        seconds=args.stream_seconds,
    )


def _memory_settings(args: argparse.Namespace) -> MemorySettings:
    return MemorySettings(
        rollouts=args.memory_rollouts, history_tokens=args.memory_tokens, lanes=args.memory_lanes
    )


def _loop_factory() -> Any:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - non-POSIX
        return None
    return uvloop.new_event_loop


def run_load(args: argparse.Namespace) -> int:
    """``--load``: prints and optionally writes the load report; exit 1 if anything was lost."""
    settings = LoadSettings(
        args.load_connections, args.load_turns, args.load_http_clients,
        resume=args.load_resume, client_processes=max(1, args.client_processes),
        server_pids=tuple(args.server_pid), api_key=args.load_api_key,
    )  # fmt: skip
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        if args.load_two_keys:
            report = runner.run(run_two_keys(settings, args.load_two_keys))
        else:
            report = runner.run(main_load(settings, args.url))
    print(json.dumps(report, indent=1))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    lost = report["lost"] + report["misordered"] + report.get("acknowledged_missing", 0)
    return 0 if lost == 0 else 1


def run_chaos_mode(args: argparse.Namespace) -> int:
    """``--chaos``: prints (and with ``--json`` writes) the per-fault report; exit 1 if any
    acknowledged response was lost (CHAOS-3)."""
    from clients.bench.suites.chaos import ChaosSettings, run_chaos

    settings = ChaosSettings(
        seconds=args.chaos_seconds, interval=args.chaos_interval,
        client_processes=max(1, args.client_processes if args.client_processes > 1 else 3),
    )  # fmt: skip
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        report = runner.run(run_chaos(settings))
    print(json.dumps(report, indent=1))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 0 if report["acknowledged_lost"] == 0 and report["unreadable"] == 0 else 1


def run_soak_mode(args: argparse.Namespace) -> int:
    """``--soak``: prints (and with ``--json`` writes) the report; exit 1 on any client-visible
    error without faults, and with faults on a lost acknowledged response or a background
    response left unfinished (LIVE-9)."""
    from clients.bench.suites.soak import SoakSettings, run_soak

    settings = SoakSettings(
        seconds=args.soak_seconds, kill_interval=args.soak_kill_interval,
        client_processes=max(1, args.client_processes if args.client_processes > 1 else 2),
    )  # fmt: skip
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        report = runner.run(run_soak(settings))
    print(json.dumps(report, indent=1))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    lost = report["acknowledged_lost"] + report["unreadable"] + report["background_unfinished"]
    errors = report["client_errors"] if settings.kill_interval == 0 else 0
    return 0 if lost == 0 and errors == 0 else 1


def run_upstream_kind(args: argparse.Namespace) -> int:
    """``--upstream-kind``: prints the side-by-side table; ``--json`` writes the turns."""
    from clients.bench.suites.upstream_kind import KINDS, render, run_upstream_kinds

    kinds = [k.strip() for k in args.upstream_kind.split(",") if k.strip()]
    if not kinds or any(k not in KINDS for k in kinds):
        print(f"rollout bench: --upstream-kind takes {','.join(KINDS)}", file=sys.stderr)
        return 2
    calls = args.turns or CODEX_CALLS
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        doc = runner.run(run_upstream_kinds(kinds, calls, args.history_scale))
    print(render(doc))
    if args.json is not None:
        args.json.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return 0


def run_peers_mode(args: argparse.Namespace) -> int:
    """``--peers``: prints the side-by-side table; ``--json``/``--png`` write it (BENCH-10)."""
    from clients.bench.suites import peers

    targets = tuple(t.strip() for t in args.peers_targets.split(",") if t.strip())
    transports = tuple(t.strip() for t in args.peers_transports.split(",") if t.strip())
    if not targets or any(t not in peers.TARGETS for t in targets):
        print(f"rollout bench: --peers-targets takes {','.join(peers.TARGETS)}", file=sys.stderr)
        return 2
    if not transports or any(t not in peers.TRANSPORTS for t in transports):
        known = ",".join(peers.TRANSPORTS)
        print(f"rollout bench: --peers-transports takes {known}", file=sys.stderr)
        return 2
    settings = peers.PeerSettings(
        turns=args.turns or 25, repeat=args.repeat, targets=targets,
        engine_upstream=args.peers_upstream, transports=transports, profile=args.peers_profile,
        callgrind=args.peers_callgrind,
    )  # fmt: skip
    if settings.callgrind:
        from clients.bench.suites.instructions import CallgrindUnavailable, check_tools

        try:
            check_tools()
        except CallgrindUnavailable as exc:
            print(f"rollout bench: {exc}", file=sys.stderr)
            return 2
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            doc = runner.run(peers.run_peers(settings))
    except (RuntimeError, OSError) as exc:
        print(f"rollout bench: failed: {exc}", file=sys.stderr)
        return 1
    print(peers.render(doc))
    if args.json is not None:
        args.json.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    if args.png is not None and doc["summary"]:
        peers.write_png(args.png, doc)
    return 0


def run_bench(args: argparse.Namespace) -> int:
    if args.peers:
        return run_peers_mode(args)
    if args.chaos:
        return run_chaos_mode(args)
    if args.soak:
        return run_soak_mode(args)
    if args.load:
        return run_load(args)
    if args.upstream_kind:
        return run_upstream_kind(args)
    only_extras = args.stream or args.memory
    try:
        config = scenario_config(args) if (args.scenario or not only_extras) else None
    except ValueError as exc:
        print(f"rollout bench: {exc}", file=sys.stderr)
        return 2
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            doc = runner.run(_run(args, config))
    except (BenchError, RuntimeError, OSError) as exc:
        print(f"rollout bench: failed: {exc}", file=sys.stderr)
        return 1
    table.render(doc)
    for line in report.instruction_lines(doc["runs"]):
        print(line)
    if args.json is not None:
        args.json.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    if args.png is not None and doc["runs"]:
        try:
            from clients.bench.plot import write_png

            write_png(args.png, doc["runs"])
        except ImportError:
            print("rollout bench: --png needs matplotlib (pip install matplotlib)", file=sys.stderr)
            return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m clients.bench", description=__doc__)
    add_arguments(parser)
    return run_bench(parser.parse_args(argv))
