"""LIM-13 end to end: SIGTERM to a real ``rollout serve`` process mid-response."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path

import aiohttp

from tests.support.server import stdout_port
from tests.support.wait import wait_healthy


async def test_sigterm_drains_in_flight_then_exits_cleanly(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cli", "serve", "--port", "0", "--announce-port",
        "--tps", "40", "--ledger", str(ledger), "--log-level", "WARNING", "--store", "memory://",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        port = await stdout_port(proc)
        await wait_healthy(f"http://127.0.0.1:{port}/healthz", "the server to start")
        async with (
            aiohttp.ClientSession() as http,
            http.ws_connect(f"ws://127.0.0.1:{port}/v1/responses") as ws,
        ):
            await ws.send_json({"type": "response.create", "input": "tell me something long"})
            first = json.loads((await ws.receive(timeout=10)).data)
            assert first["type"] == "response.created"
            proc.send_signal(signal.SIGTERM)  # mid-stream: ~0.5 s of tokens still to come
            types = []
            while True:
                msg = await ws.receive(timeout=10)
                if msg.type is not aiohttp.WSMsgType.TEXT:
                    break
                types.append(json.loads(msg.data)["type"])
            assert types[-1] == "response.completed"  # allowed to finish within the grace
            assert ws.close_code == 1001  # then going away: the SDK reconnects
        assert await asyncio.wait_for(proc.wait(), 20) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    (record,) = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert record["response_ids"] == [first["response"]["id"]]  # post-inference drained
    assert record["status"] == "completed"
