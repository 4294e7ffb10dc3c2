"""The bounded FIFO between tasks (``engine/fifo.py``): the lanes' create queues (WS-5, WS-6)
and post-inference's record queue (POST-2) keep ``asyncio.Queue``'s semantics. Each test
drives the same steps through ``asyncio.Queue`` too and asserts the two agree."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from engine.fifo import Fifo


def both(maxsize: int) -> list[Any]:
    return [Fifo[int](maxsize), asyncio.Queue[int](maxsize)]


@pytest.mark.parametrize("queue", both(3), ids=["fifo", "asyncio"])
async def test_items_leave_in_order_and_a_full_queue_refuses(queue: Any) -> None:
    """WS-5, WS-6: first in, first out; past ``maxsize`` ``put_nowait`` raises QueueFull."""
    for n in range(3):
        queue.put_nowait(n)
    assert queue.full() and queue.qsize() == 3
    with pytest.raises(asyncio.QueueFull):
        queue.put_nowait(3)
    assert [await queue.get() for _ in range(3)] == [0, 1, 2]
    assert queue.empty() and not queue.full()


@pytest.mark.parametrize("queue", both(0), ids=["fifo", "asyncio"])
async def test_unbounded_takes_any_number(queue: Any) -> None:
    for n in range(1000):
        queue.put_nowait(n)
    assert queue.qsize() == 1000 and not queue.full()


@pytest.mark.parametrize("queue", both(1), ids=["fifo", "asyncio"])
async def test_waiting_getters_are_served_in_arrival_order(queue: Any) -> None:
    got: list[tuple[str, int]] = []

    async def take(name: str) -> None:
        got.append((name, await queue.get()))

    tasks = [asyncio.create_task(take(name)) for name in "abc"]
    await asyncio.sleep(0)
    for n in range(3):
        await queue.put(n)
        await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    assert got == [("a", 0), ("b", 1), ("c", 2)]


@pytest.mark.parametrize("queue", both(1), ids=["fifo", "asyncio"])
async def test_put_waits_for_room(queue: Any) -> None:
    """POST-2's ``submit``: a full queue holds the producer until the worker takes one."""
    queue.put_nowait(1)
    putter = asyncio.create_task(queue.put(2))
    await asyncio.sleep(0.01)
    assert not putter.done()
    assert await queue.get() == 1
    await asyncio.wait_for(putter, 1)
    assert await queue.get() == 2


@pytest.mark.parametrize("queue", both(0), ids=["fifo", "asyncio"])
async def test_a_woken_getter_cancelled_passes_the_item_on(queue: Any) -> None:
    """A getter woken by a put and cancelled before it ran must not strand the item: the
    next waiting getter takes it."""
    first = asyncio.create_task(queue.get())
    second = asyncio.create_task(queue.get())
    await asyncio.sleep(0)
    queue.put_nowait(7)  # wakes ``first``
    first.cancel()
    assert await asyncio.wait_for(second, 1) == 7
    with pytest.raises(asyncio.CancelledError):
        await first


@pytest.mark.parametrize("queue", both(0), ids=["fifo", "asyncio"])
async def test_a_cancelled_getter_leaves_no_waiter_behind(queue: Any) -> None:
    getter = asyncio.create_task(queue.get())
    await asyncio.sleep(0)
    getter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await getter
    queue.put_nowait(1)
    assert queue.qsize() == 1 and await queue.get() == 1


@pytest.mark.parametrize("queue", both(2), ids=["fifo", "asyncio"])
async def test_join_waits_for_every_item_done(queue: Any) -> None:
    """POST-2's ``stop`` and the session's drain (``join``): only once every item put is
    ``task_done``."""
    await queue.join()  # nothing put: returns at once
    queue.put_nowait(1)
    queue.put_nowait(2)
    joiners = [asyncio.create_task(queue.join()) for _ in range(2)]
    await asyncio.sleep(0)  # both wait before the first item is done
    await queue.get()
    queue.task_done()
    await asyncio.sleep(0.01)
    assert not any(j.done() for j in joiners)
    await queue.get()
    queue.task_done()
    await asyncio.wait_for(asyncio.gather(*joiners), 1)
    with pytest.raises(ValueError):
        queue.task_done()
