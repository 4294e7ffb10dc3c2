"""Waiting on a condition instead of sleeping: a test states what it waits for (TEST-2)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable

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
