"""A session's suspended rollouts handed to the process's parking lot (SPEC: PARK-1, PARK-4).

A closing WebSocket parks each standard-mode rollout suspended at a lane's latest response
(PARK-1). An HTTP create whose ``store: true`` response ends with its rollout suspended (a tool
call, COMPAT-1) parks it as soon as the response has ended, before its request does (PARK-4):
the chain's next create names that response and resumes the very coroutine (PARK-3) instead of
building a new rollout over the hydration cache's context (HYD-1). Either way the lot owns the
task from then on, and the rollout lets go of the session: its lane slot, its sink (and through
it the socket's or the request's buffers) and the session's done-callback, so it holds no more
than the lot charges it (PARK-7).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from engine.connection.lane import Lane
from engine.core import Engine
from engine.rollout.coroutine import Rollout
from engine.rollout.turn import Mode

Reap = Callable[[asyncio.Task[None]], None]


def park_latest(
    engine: Engine,
    owner: str | None,
    lane: Lane,
    rollouts: Mapping[asyncio.Task[None], Rollout],
    reap: Reap,
    *,
    chain: bool = False,
) -> asyncio.Task[None] | None:
    """Park the standard-mode rollout suspended at ``lane``'s latest response, keyed by that
    response id, for ``owner``; returns its task (no longer the session's), or None when nothing
    was parked. ``chain``: an HTTP create's (PARK-4): only a ``store: true`` response's rollout
    (a ``store: false`` one is continued by nobody over HTTP), and its address is registered
    nowhere (PARK-20): another node continues a stored response from the store (PARK-9)."""
    entry = lane.latest
    rollout = entry.rollout if entry is not None else None
    if entry is None or rollout is None or rollout.mode is not Mode.STANDARD:
        return None
    if chain and not rollout.settings.store:
        return None
    task = next((t for t, r in rollouts.items() if r is rollout), None)
    if task is None:
        return None
    if not engine.parking.park(entry.response_id, rollout, task, owner, chain=chain):
        return None
    lane.release(rollout)
    task.remove_done_callback(reap)
    rollout.detach()
    return task
