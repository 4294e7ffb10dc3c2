"""Per-stage CPU shares of a py-spy profile (BENCH-11): ``python -m clients.bench.stages
FILE [--turns N]``.

FILE is ``py-spy record --format raw`` output (collapsed stacks: ``frame;frame;… count``), as
``rollout bench --peers --peers-profile FILE`` writes it. Each sample goes to the stage of the
leaf-most frame in the project's own code (``engine/…``, ``protocol/…``): library code counts
to the project code that called it (aiohttp's client to the upstream hop). Samples with no
project frame (the event loop, aiohttp's server reading a socket, the interpreter) go to
"loop and libraries". Samples waiting (epoll, a lock) are idle and left out. With
``--turns`` and ``--rate``, each stage is also given in ms per turn.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

# (path fragment, stage): the first fragment found in a frame's file names its stage; None: the
# frame is the process's root (``rollout serve`` running its loop), not a stage.
STAGES: tuple[tuple[str, str | None], ...] = (
    ("engine/server/process/serve.py", None),
    ("engine/server/process/workers.py", None),
    ("cli/", None),
    ("engine/models/upstreams/", "upstream hop (request, stream read, mapping)"),
    ("engine/models/tokens/", "tokens route (render, parse)"),
    ("engine/models/", "models (router, simulator)"),
    ("engine/conversation/", "pipeline (validate, scan, render, count)"),
    ("engine/rollout/", "rollout (coroutine, sampling, endings)"),
    ("engine/connection/", "connection (session, loader, admission)"),
    ("engine/server/transport/ws.py", "WebSocket driver (read, decode, send)"),
    ("engine/server/transport/http.py", "HTTP driver"),
    ("engine/server/", "server (other)"),
    ("engine/observe/", "observe (post-inference, metrics, turn log)"),
    ("engine/store/", "store"),
    ("engine/retained/", "shared caches"),
    ("protocol/stream.py", "events (stream builder)"),
    ("protocol/states.py", "events (stream builder)"),
    ("protocol/codec.py", "codec (decode, encode)"),
    ("protocol/sse.py", "SSE (framing, decoding)"),
    ("protocol/", "protocol (other)"),
    ("engine/", "engine (other)"),
)
OTHER = "loop and libraries (no project frame)"
IDLE = "idle"
# A sample whose leaf frames wait (py-spy --native cannot tell idle threads by itself).
_WAITING = ("epoll_pwait", "epoll_wait", "acquire_lock", "pthread_cond", "futex", "sem_wait")
_FILE = re.compile(r"\(([^():]+)(?::\d+)?\)$")


def stage_of(stack: str) -> str:
    frames = stack.split(";")
    if any(w in f for f in frames[-4:] for w in _WAITING):
        return IDLE
    for frame in reversed(frames):
        match = _FILE.search(frame)
        if match is None:
            continue
        path = match.group(1)
        for fragment, stage in STAGES:
            if fragment in path:
                if stage is None:
                    return OTHER
                return stage
    return OTHER


def shares(text: str) -> Counter[str]:
    counts: Counter[str] = Counter()
    for line in text.splitlines():
        stack, _, number = line.rpartition(" ")
        if stack and number.isdigit():
            stage = stage_of(stack)
            if stage != IDLE:
                counts[stage] += int(number)
    return counts


def render(counts: Counter[str], turns: int | None, rate: int) -> str:
    total = sum(counts.values()) or 1
    lines = [f"{total} samples"]
    for stage, n in counts.most_common():
        per_turn = f"  {n / rate * 1000 / turns:6.3f} ms/turn" if turns else ""
        lines.append(f"{100 * n / total:5.1f}%  {stage}{per_turn}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m clients.bench.stages", description=__doc__)
    parser.add_argument("file", type=Path)
    parser.add_argument("--turns", type=int, default=None, help="turns the profile covers")
    parser.add_argument("--rate", type=int, default=1000, help="py-spy's samples per second")
    args = parser.parse_args(argv)
    print(render(shares(args.file.read_text()), args.turns, args.rate))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
