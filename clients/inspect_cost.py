"""What the inspector's feed costs the server: CPU per second with many suspended rollouts and
one viewer, against the same server with no viewer (SPEC: INSP-3).

    python -m clients.inspect_cost [--rollouts 1000] [--seconds 10] [--rounds 3] [--browser]

Starts ``rollout serve`` as a subprocess (the bench's ``ServerProcess``), suspends ``--rollouts``
rollouts on a function call (32 lanes per WebSocket connection, standard mode), then alternates
windows with no viewer and with one ``/inspect/feed`` viewer (what the page's script does: read
every snapshot; with ``--browser`` the real page in headless chromium instead) and reads the
server's CPU time from ``/proc``. Prints medians. A benchmark, not
a test: it asserts nothing about time. Plain JSON over aiohttp, like any client; it imports
nothing from ``engine``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from clients.bench.proc import ServerProcess, cpu_seconds

LANES_PER_CONNECTION = 32  # the server's default --max-lanes
TOOL = {
    "type": "function",
    "name": "lookup",
    "description": "Look something up.",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
}


async def suspend(ws: aiohttp.ClientWebSocketResponse, lanes: int, offset: int) -> None:
    """``lanes`` tool-calling creates on this connection; returns when each has suspended."""
    for lane in range(lanes):
        await ws.send_json(
            {
                "type": "response.create",
                "model": "sim",
                "input": f"Please lookup item {offset + lane}",
                "tools": [TOOL],
                "store": False,
                "stream_id": f"lane-{lane}",
            }
        )
    done = 0
    while done < lanes:
        event = await ws.receive_json(timeout=60)
        if event["type"] == "error":
            raise RuntimeError(f"create refused: {event['error']}")
        done += event["type"] == "response.completed"


@dataclass
class Viewer:
    """Reads the feed as the page does; counts snapshots and bytes."""

    snapshots: int = 0
    bytes: int = 0
    last: dict[str, Any] = field(default_factory=dict)

    async def watch(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        async for message in ws:
            if message.type is not aiohttp.WSMsgType.TEXT:
                break
            self.snapshots += 1
            self.bytes += len(message.data)
            if self.snapshots % 10 == 1:
                self.last = message.json()


async def window(pid: int, seconds: float) -> float:
    """Server CPU seconds per wall second over one window."""
    cpu0, wall0 = cpu_seconds(pid), time.monotonic()
    await asyncio.sleep(seconds)
    return (cpu_seconds(pid) - cpu0) / (time.monotonic() - wall0)


async def measure(args: argparse.Namespace) -> None:
    async with ServerProcess(tokens_per_second=1000.0, idle_timeout_s=3600.0) as server:
        base = f"ws://127.0.0.1:{server.port}"
        async with aiohttp.ClientSession() as http:
            sockets = []
            left, offset = args.rollouts, 0
            while left > 0:
                lanes = min(LANES_PER_CONNECTION, left)
                ws = await http.ws_connect(f"{base}/v1/responses", max_msg_size=0)
                await suspend(ws, lanes, offset)
                sockets.append(ws)
                left, offset = left - lanes, offset + lanes
            print(f"{args.rollouts} rollouts suspended on {len(sockets)} connections", flush=True)
            await asyncio.sleep(1.0)
            idle, watched, viewer = await rounds(http, base, server.pid, args)
            for ws in sockets:
                await ws.close()
    report(args, idle, watched, viewer)


async def rounds(
    http: aiohttp.ClientSession, base: str, pid: int, args: argparse.Namespace
) -> tuple[list[float], list[float], Viewer]:
    idle: list[float] = []
    watched: list[float] = []
    viewer = Viewer()
    for _ in range(args.rounds):
        idle.append(await window(pid, args.seconds))
        if args.browser:
            watched.append(await in_browser(base.replace("ws://", "http://"), pid, args))
            continue
        feed = await http.ws_connect(f"{base}/inspect/feed", max_msg_size=0)
        reader = asyncio.create_task(viewer.watch(feed))
        await asyncio.sleep(1.0)  # the first snapshot and the page's settling
        watched.append(await window(pid, args.seconds))
        await feed.close()
        await reader
        await asyncio.sleep(1.0)
    return idle, watched, viewer


async def in_browser(root: str, pid: int, args: argparse.Namespace) -> float:
    """One window with the real page open in Debian's headless chromium (playwright is a dev
    dependency, imported only here)."""
    from playwright.async_api import async_playwright

    flags = [
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
    ]  # fmt: skip
    async with async_playwright() as driver:
        browser = await driver.chromium.launch(executable_path=args.chromium, args=flags)
        page = await browser.new_page()
        await page.goto(f"{root}/inspect")
        await page.wait_for_selector("#rollouts tbody tr")
        await asyncio.sleep(1.0)
        used = await window(pid, args.seconds)
        await browser.close()
    await asyncio.sleep(1.0)
    return used


def report(args: argparse.Namespace, idle: list[float], watched: list[float], v: Viewer) -> None:
    base, seen = statistics.median(idle), statistics.median(watched)
    totals = v.last.get("totals", {})
    rows = len(v.last.get("rollouts", []))
    print(f"server CPU, no viewer:      {base * 1000:7.1f} ms/s  (windows: {_ms(idle)})")
    print(f"server CPU, one viewer:     {seen * 1000:7.1f} ms/s  (windows: {_ms(watched)})")
    print(f"feed cost (median delta):   {(seen - base) * 1000:7.1f} ms/s  = "
          f"{(seen - base) * 100:.2f}% of one core")  # fmt: skip
    if args.browser:
        return
    print(f"snapshots: {v.snapshots}, mean {v.bytes // max(v.snapshots, 1):,} bytes; "
          f"{rows} rows of {totals.get('suspended')} suspended")  # fmt: skip


def _ms(values: list[float]) -> str:
    return ", ".join(f"{x * 1000:.1f}" for x in values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rollouts", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=10.0, help="per measuring window")
    parser.add_argument("--rounds", type=int, default=3, help="idle/watched window pairs")
    parser.add_argument("--browser", action="store_true", help="watch with the real page")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    asyncio.run(measure(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
