"""Measure the Codex task of ``test_codex_cli`` (a figure, not a test): wall time and the frames
the server writes, over WebSocket and over HTTP, with the simulator paced at 1,000 tokens/s
(``rollout serve --tps 1000``). Median of N runs per transport.

    .venv/bin/python -m tests.conformance.measure_codex [--runs 5] [--tps 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from engine.core import Engine, EngineConfig
from engine.server.app import create_app
from engine.server.transport import http as http_routes
from engine.server.transport import ws as ws_driver
from protocol.codec import encode
from tests.conformance.codex import (
    KEY_ENV,
    MARKER,
    PROMPT,
    CodexTask,
    codex_binary,
    write_config,
)
from tests.support.server import serve_app

SENT: Counter[str] = Counter()


def count_frames() -> None:
    """Count every event the two sinks write (frames over WS, SSE events over HTTP), and bytes."""
    for transport, sink in (("ws", ws_driver.WsSink), ("http", http_routes.HttpSink)):
        original = sink.send

        async def send(self: Any, event: Any, _orig: Any = original, _t: str = transport) -> None:
            SENT[f"{_t}.frames"] += 1
            SENT[f"{_t}.bytes"] += len(encode(event))
            await _orig(self, event)

        sink.send = send  # type: ignore[method-assign]


async def one_run(base_url: str, websockets: bool) -> tuple[float, dict[str, int]]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_config(root / "home", base_url, websockets, CodexTask())
        (root / "work").mkdir()
        (root / "work" / MARKER).write_text("hello\n")
        env = {"PATH": os.environ["PATH"], "HOME": tmp, "CODEX_HOME": str(root / "home")}
        env[KEY_ENV] = "dummy"
        before = Counter(SENT)
        start = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(
            str(codex_binary()),
            *("exec", "--skip-git-repo-check", "--color", "never", PROMPT),
            cwd=root / "work",
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, _ = await proc.communicate()
        wall = time.perf_counter() - start
        assert proc.returncode == 0 and MARKER in out.decode(), out.decode()[-2000:]
        return wall, dict(Counter(SENT) - before)


async def main(runs: int, tps: float) -> None:
    count_frames()
    runner, port = await serve_app(create_app(Engine(EngineConfig(tokens_per_second=tps))))
    base_url = f"http://127.0.0.1:{port}/v1"
    report: dict[str, Any] = {}
    try:
        for name, websockets in (("websocket", True), ("http", False)):
            results = [await one_run(base_url, websockets) for _ in range(runs)]
            key = "ws" if websockets else "http"
            report[name] = {
                "wall_s_median": round(statistics.median(r[0] for r in results), 3),
                "wall_s_all": [round(r[0], 3) for r in results],
                "frames_median": statistics.median(r[1].get(f"{key}.frames", 0) for r in results),
                "bytes_median": statistics.median(r[1].get(f"{key}.bytes", 0) for r in results),
            }
    finally:
        await runner.cleanup()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tps", type=float, default=1000.0)
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.tps))
