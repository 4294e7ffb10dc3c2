"""``rollout serve | agent | bench | cluster | export``: parse the subcommand, hand it to its side.

Each side is imported only when its subcommand runs: ``rollout serve`` never loads the clients
(rich, the benchmark) and ``rollout bench`` never loads the server it starts in a subprocess.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

Handler = Callable[[argparse.Namespace], int]


def _serve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> Handler:
    from engine.server.process.flags import add_serve_parser
    from engine.server.process.serve import serve

    add_serve_parser(sub)
    return serve


def _agent(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> Handler:
    from clients.demo import add_agent_parser, run_agent

    add_agent_parser(sub)
    return run_agent


def _bench(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> Handler:
    from clients.bench.cli import add_bench_parser, run_bench

    add_bench_parser(sub)
    return run_bench


def _cluster(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> Handler:
    from cli.launcher import add_cluster_parser, run_cluster

    add_cluster_parser(sub)
    return run_cluster


def _export(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> Handler:
    from clients.export import add_export_parser, run_export

    add_export_parser(sub)
    return run_export


COMMANDS = {
    "serve": _serve,
    "agent": _agent,
    "bench": _bench,
    "cluster": _cluster,
    "export": _export,
}
DESCRIPTION = "The rollout engine: serve the Responses API, run the demo agent, benchmark a server."


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="rollout", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)
    named = argv[0] if argv and argv[0] in COMMANDS else None
    # Only the named side is imported; without one (help, a typo) every side is, for the usage.
    handlers = {name: register(sub) for name, register in COMMANDS.items() if named in (None, name)}
    args = parser.parse_args(argv)
    return handlers[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
