"""A time limit on a section a rollout enters every turn, at a fraction of ``asyncio.timeout``'s
cost (issue 28: two of them per turn were ~2% of a WebSocket turn's CPU).

``asyncio.timeout`` arms a loop timer on entry and cancels it on exit: a heap entry, a handle
object and a Python-level context manager per use. A ``Deadline`` belongs to one rollout and
keeps at most one timer: entering moves the deadline (an assignment), leaving marks the
section closed, and the timer, when it fires early, moves itself to the current deadline; it
ends with the section, or with the rollout (``close``). On expiry it behaves as
``asyncio.timeout`` does (Python 3.11): the task is cancelled, and leaving the section turns
that cancellation into ``TimeoutError``, unless the task was also cancelled from outside.
"""

from __future__ import annotations

import asyncio
from types import TracebackType


class Deadline:
    __slots__ = ("_armed", "_cancelling", "_delay", "_expired", "_handle", "_loop", "_task", "at")

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        # Its owner's loop, or the first section's. Held, not looked up per section: on Python
        # 3.11 every ``get_running_loop`` (``current_task()`` too) is a ``getpid`` system call.
        self._loop = loop
        self._handle: asyncio.TimerHandle | None = None
        self._armed = 0.0  # when the handle fires
        self._delay = 0.0
        self._task: asyncio.Task[object] | None = None  # in the section (None: outside)
        self._cancelling = 0
        self._expired = False
        self.at = 0.0  # the current section's deadline (loop time)

    def within(self, seconds: float) -> Deadline:
        """``async with deadline.within(s):`` limits the section to ``s`` seconds."""
        self._delay = seconds
        return self

    def when(self) -> float | None:
        """The deadline while a section runs, else None (``asyncio.Timeout.when``)."""
        return self.at if self._task is not None else None

    def elapsed(self) -> float | None:
        """Seconds the running section has used of its limit (its start: the deadline less
        the limit, so a ``reschedule`` to the limit from now starts it again), else None."""
        if self._task is None or self._loop is None:
            return None
        return max(self._loop.time() - (self.at - self._delay), 0.0)

    def reschedule(self, at: float) -> None:
        """Move the running section's deadline (later or earlier)."""
        self.at = at
        if self._handle is not None and at < self._armed:
            self._arm()

    async def __aenter__(self) -> Deadline:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        assert task is not None and self._task is None
        self._task, self._cancelling, self._expired = task, task.cancelling(), False
        self.at = loop.time() + self._delay
        if self._handle is None or self.at < self._armed:
            self._arm()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        task, self._task = self._task, None
        if self._expired and task is not None:
            self._expired = False
            if task.uncancel() <= self._cancelling and kind is asyncio.CancelledError:
                raise TimeoutError from exc

    def close(self) -> None:
        """The owner is done: no timer outlives it."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _arm(self) -> None:
        assert self._loop is not None
        if self._handle is not None:
            self._handle.cancel()
        self._armed = self.at
        self._handle = self._loop.call_at(self.at, self._fire)

    def _fire(self) -> None:
        self._handle = None
        task = self._task
        if task is None or self._expired:
            return  # outside any section: the next one arms again
        if self._loop is not None and self._loop.time() < self.at:
            self._arm()
            return
        self._expired = True
        task.cancel()
