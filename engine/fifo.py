"""A bounded FIFO between tasks: the lanes' create queues (WS-5, WS-6) and post-inference's
record queue (POST-2).

The subset of ``asyncio.Queue`` those two use (``put_nowait``, ``put``, ``get``,
``task_done``, ``join``, ``empty``, ``full``, ``maxsize``), with the same semantics: FIFO,
``asyncio.QueueFull`` past ``maxsize`` (0: unbounded), waiters woken in arrival order, a
cancelled waiter passing its wake-up on. Handing one item to a waiting consumer takes
``asyncio.Queue`` 17 Python-level calls (``full``, ``qsize``, ``_put``, an ``Event`` cleared
and set, ``_wakeup_next`` on both sides, ``get_nowait``, ``empty`` three times, ``_get``) and
this one 5 (``put_nowait``, ``_wake_first``, ``get`` and its resume, ``task_done``); every
compat turn hands over two items (docs/benchmark.md, issue 48 §2, fifth pass).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


def _wake_first(waiters: deque[asyncio.Future[None]]) -> None:
    while waiters:
        waiter = waiters.popleft()
        if not waiter.done():
            waiter.set_result(None)
            return


class Fifo(Generic[T]):
    __slots__ = ("_getters", "_idle", "_items", "_putters", "_unfinished", "maxsize")

    def __init__(self, maxsize: int = 0) -> None:
        self.maxsize = maxsize
        self._items: deque[T] = deque()
        self._getters: deque[asyncio.Future[None]] = deque()
        self._putters: deque[asyncio.Future[None]] = deque()
        self._idle: list[asyncio.Future[None]] = []  # ``join`` callers
        self._unfinished = 0  # items put and not yet ``task_done``

    def qsize(self) -> int:
        return len(self._items)

    def empty(self) -> bool:
        return not self._items

    def full(self) -> bool:
        return 0 < self.maxsize <= len(self._items)

    def put_nowait(self, item: T) -> None:
        if 0 < self.maxsize <= len(self._items):
            raise asyncio.QueueFull
        self._items.append(item)
        self._unfinished += 1
        if self._getters:
            _wake_first(self._getters)

    async def put(self, item: T) -> None:
        while 0 < self.maxsize <= len(self._items):
            putter = asyncio.get_running_loop().create_future()
            self._putters.append(putter)
            try:
                await putter
            except BaseException:
                self._leave(self._putters, putter, not self.full())
                raise
        self.put_nowait(item)

    async def get(self) -> T:
        items = self._items
        while not items:  # ``_wait`` inlined: a consumer usually waits, and is resumed here
            getter = asyncio.get_running_loop().create_future()
            self._getters.append(getter)
            try:
                await getter
            except BaseException:
                self._leave(self._getters, getter, bool(items))
                raise
        item = items.popleft()
        if self._putters:
            _wake_first(self._putters)
        return item

    def task_done(self) -> None:
        if self._unfinished <= 0:
            raise ValueError("task_done() called too many times")
        self._unfinished -= 1
        if not self._unfinished and self._idle:
            idle, self._idle = self._idle, []
            for waiter in idle:
                if not waiter.done():
                    waiter.set_result(None)

    async def join(self) -> None:
        """Until every item put has been ``task_done``."""
        if self._unfinished:
            waiter = asyncio.get_running_loop().create_future()
            self._idle.append(waiter)
            try:
                await waiter
            finally:
                with contextlib.suppress(ValueError):
                    self._idle.remove(waiter)

    @staticmethod
    def _leave(
        waiters: deque[asyncio.Future[None]], waiter: asyncio.Future[None], may_go: bool
    ) -> None:
        """A waiter cancelled (or failed): it leaves the line; if it had been woken, the
        wake-up goes to the next one."""
        waiter.cancel()
        with contextlib.suppress(ValueError):
            waiters.remove(waiter)
        if may_go and not waiter.cancelled():
            _wake_first(waiters)  # woken, then cancelled: the wake-up goes to the next one
