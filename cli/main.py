"""``rollout serve | agent | bench``: parse the subcommand, hand it to its side, nothing else."""

from __future__ import annotations

import argparse
import sys

from clients.bench.cli import add_bench_parser, run_bench
from clients.demo import add_agent_parser, run_agent
from engine.server.cli import add_serve_parser, serve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rollout", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    add_serve_parser(sub)
    add_agent_parser(sub)
    add_bench_parser(sub)
    args = parser.parse_args(argv)
    if args.command == "serve":
        return serve(args)
    if args.command == "bench":
        return run_bench(args)
    return run_agent(args)


if __name__ == "__main__":
    sys.exit(main())
