"""Graceful drain of one ``rollout serve`` process (DRAIN-1..DRAIN-3, LIM-13): SIGTERM fails
``/healthz`` at once while the node still serves for ``--drain-delay``; then it stops listening,
closes each idle WebSocket with 1001 ``shutdown`` at once, lets the running response finish,
closes that socket too and exits 0."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import aiohttp
import msgspec

from tests.store._procs import ServeProcess
from tests.support.wait import wait_for

SLOW = "bench-text/200"  # 200 tokens at 40 tokens/s: about five seconds of streaming


async def _create(ws: aiohttp.ClientWebSocketResponse, model: str) -> None:
    await ws.send_str(
        msgspec.json.encode(
            {"type": "response.create", "model": model, "input": "go", "store": False}
        ).decode()
    )


async def _readiness(http: aiohttp.ClientSession, base: str) -> dict[str, Any] | None:
    """``/healthz``'s 503 body once the node is unready; None while it still answers 200."""
    async with http.get(f"{base}/healthz") as resp:
        if resp.status == 200:
            return None
        assert resp.status == 503
        body: dict[str, Any] = await resp.json()
        return body


async def _until_terminal(ws: aiohttp.ClientWebSocketResponse, log: list[str], name: str) -> None:
    """Read frames until the socket closes, noting the terminal events and the close."""
    while True:
        msg = await ws.receive(timeout=30)
        if msg.type is aiohttp.WSMsgType.TEXT:
            event: dict[str, Any] = msgspec.json.decode(msg.data)
            if event["type"] in ("response.completed", "response.failed", "error"):
                log.append(f"{name}:{event['type']}")
            continue
        log.append(f"{name}:close:{ws.close_code}:{msg.extra or ''}")
        return


async def test_sigterm_drains_idle_sockets_first(tmp_path: Path) -> None:
    """DRAIN-1, DRAIN-2, DRAIN-3: readiness fails first, work still runs during the delay, the
    idle socket closes 1001 before the busy one's response completes, and nothing is cut."""
    node = ServeProcess(
        "memory://", tmp_path, "--bench-models", "--tps", "40", "--drain-delay", "1"
    )
    await node.start()
    try:
        assert node.proc is not None
        log: list[str] = []
        async with aiohttp.ClientSession() as http:
            idle = await http.ws_connect(node.ws_url)
            busy = await http.ws_connect(node.ws_url)
            await _create(idle, "bench-text/1")
            msg = await idle.receive(timeout=10)
            assert msg.type is aiohttp.WSMsgType.TEXT
            while "response.completed" not in msg.data:
                msg = await idle.receive(timeout=10)
            await _create(busy, SLOW)
            first = await busy.receive(timeout=10)  # response.created: it is running
            assert b"response.created" in first.data.encode()
            readers = [
                asyncio.create_task(_until_terminal(idle, log, "idle")),
                asyncio.create_task(_until_terminal(busy, log, "busy")),
            ]
            node.proc.send_signal(signal.SIGTERM)
            # The signal reaches the node's loop a moment later; readiness fails from then on,
            # well inside the drain delay.
            body: Any = await wait_for(lambda: _readiness(http, node.base), "readiness to fail")
            assert body["error"]["code"] == "server_shutting_down"  # the ERR-2 envelope
            async with http.post(  # still serving: the balancer has not taken it out yet
                f"{node.base}/v1/responses", json={"model": "bench-text/1", "input": "x"}
            ) as resp:
                assert resp.status == 200
            await asyncio.gather(*readers)
            await idle.close()
            await busy.close()
        assert await asyncio.wait_for(node.proc.wait(), 30) == 0, node.logs()
        assert log == [
            "idle:close:1001:shutdown",
            "busy:response.completed",
            "busy:close:1001:shutdown",
        ], log
    finally:
        await node.kill9()  # a failed test leaves no process behind (a no-op once it exited)
