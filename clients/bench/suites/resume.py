"""The load test's resuming agents (``rollout bench --load --load-resume``, LOAD-2): standard mode
with ``store: true``, so a rollout survives the node that served it. When its socket is closed
at a drain (1001 ``shutdown``), a create is refused with ``server_shutting_down``, or the
upgrade is refused while a node stops, the agent reconnects (through the balancer, to any node)
and sends its pending create again; the chain continues from the store.

Those are the documented drain signals (DRAIN-3, LIM-13); each is counted by kind. Anything
else is an error, and the rollout is counted as lost. Every response the agent saw completed is
acknowledged; after the run, each is read back with ``GET /v1/responses/{id}``.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import aiohttp

from clients.bench.scenario import coding_model
from clients.bench.suites.load_checks import TERMINALS, TOOLS, Checker, LoadCounts, tool_output

MAX_RECONNECTS = 20  # a rollout that cannot get a socket this many times in a row is lost
DRAIN_CLOSE = 1001  # WSCloseCode.GOING_AWAY, reason "shutdown" (DRAIN-3)


class Drained(Exception):
    """A documented drain signal: reconnect and resend."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


async def resuming_agent(
    session: aiohttp.ClientSession, ws_url: str, turns: int, counts: LoadCounts
) -> None:
    """One rollout of ``turns`` tool calls, every frame checked as in LOAD-1."""
    pending: dict[str, Any] = {
        "type": "response.create",
        "model": coding_model(turns),
        "input": "Fix the tests.",
        "tools": TOOLS,
        "store": True,
    }
    failures, signalled = 0, None
    while True:
        try:
            async with session.ws_connect(ws_url, max_msg_size=0) as ws:
                if signalled is not None:  # drain signal -> a socket again (LOAD-2)
                    counts.reconnect_ms.append((time.perf_counter() - signalled) * 1000)
                    signalled = None
                check = Checker(ws, counts)
                while True:
                    check.expected = 0
                    done = await _turn(check, ws, pending, TERMINALS)
                    failures = 0
                    counts.responses += 1
                    counts.turns += 1
                    response = done["response"]
                    if response["status"] == "completed":
                        counts.acknowledged.append(response["id"])
                    last = response["output"][-1]
                    if last["type"] != "function_call":
                        return
                    pending = {
                        **pending,
                        "previous_response_id": response["id"],
                        "input": [tool_output(last["call_id"])],
                    }
        except Drained as drained:
            counts.drain_signals[drained.kind] += 1
        except aiohttp.WSServerHandshakeError as exc:
            if exc.status not in (502, 503):
                raise
            counts.drain_signals[f"upgrade_{exc.status}"] += 1
        except aiohttp.ClientConnectionError:
            counts.drain_signals["connect_refused"] += 1
        failures += 1
        signalled = signalled or time.perf_counter()
        if failures > MAX_RECONNECTS:
            raise ConnectionError("no node took the rollout back")
        counts.reconnects += 1
        await asyncio.sleep(0.05 * failures)  # back off while the balancer notices


async def _turn(
    check: Checker, ws: aiohttp.ClientWebSocketResponse, body: dict[str, Any], terminals: Any
) -> dict[str, Any]:
    try:
        done: dict[str, Any] = await check.until(*terminals, sent_at=await check.send(body))
        return done
    except ConnectionError as exc:
        if str(exc) == "server_shutting_down":
            check.counts.errors.pop()  # documented: not an error of this run (LIM-13)
            raise Drained("server_shutting_down") from exc
        if ws.close_code == DRAIN_CLOSE:
            raise Drained("ws_close_1001") from exc
        raise


async def verify_acknowledged(
    session: aiohttp.ClientSession, url: str, ids: list[str]
) -> Counter[str]:
    """Read every acknowledged response back (through the balancer): how many came back
    ``completed`` and how many did not (LOAD-2: 0 lost)."""
    found: Counter[str] = Counter()
    gate = asyncio.Semaphore(16)

    async def one(response_id: str) -> None:
        async with gate, session.get(f"{url}/responses/{response_id}") as resp:
            ok = resp.status == 200 and (await resp.json()).get("status") == "completed"
            found["retrieved" if ok else "missing"] += 1

    await asyncio.gather(*(one(i) for i in ids))
    return found
