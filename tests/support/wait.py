"""Waiting on a condition instead of sleeping: a test states what it waits for (TEST-2)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Awaitable, Callable

import aiohttp

WAIT_LIMIT_S = 10.0  # past this the condition is taken as never coming: the test fails
POLL_S = 0.01


async def wait_for(
    condition: Callable[[], object | Awaitable[object]],
    what: str = "",
    *,
    limit: float = WAIT_LIMIT_S,
) -> object:
    """Poll ``condition`` (sync or async) until it returns something truthy, and return that.
    Fails the test (``AssertionError``) when it is still false after ``limit`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"still waiting after {limit:g} s for {what or condition}")
        await asyncio.sleep(POLL_S)


async def wait_healthy(
    url: str,
    what: str,
    *,
    limit: float = WAIT_LIMIT_S,
    process: asyncio.subprocess.Process | None = None,
    logs: Callable[[], str] = str,
) -> None:
    """Until ``GET url`` answers 200 (a server the test started); a ``process`` that exits
    first fails the test at once, with its ``logs()``."""
    async with aiohttp.ClientSession() as http:

        async def healthy() -> bool:
            if process is not None and process.returncode is not None:
                raise AssertionError(f"{what}: the process exited: {logs()}")
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(url) as resp:
                    return resp.status == 200
            return False

        await wait_for(healthy, what, limit=limit)
