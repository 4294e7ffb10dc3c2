"""The rollout's section time limits (``engine/rollout/deadline.py``): each step's
``model_timeout_s`` (LIM-7) and each suspension's ``suspended_idle_timeout_s`` (ROLL-6, LIM-6)
behave as ``asyncio.timeout`` does, with one timer per rollout instead of one per section."""

from __future__ import annotations

import asyncio

import pytest

from engine.rollout.deadline import Deadline


async def test_a_section_over_its_limit_raises_timeout_and_leaves_the_task_uncancelled() -> None:
    """LIM-7: the section ends with ``TimeoutError``; the task goes on, not cancelled."""
    deadline = Deadline()
    with pytest.raises(TimeoutError):
        async with deadline.within(0.05):
            await asyncio.sleep(5)
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    await asyncio.sleep(0)  # no cancellation is left pending
    assert deadline.when() is None and deadline.elapsed() is None


async def test_sections_within_their_limit_pass_and_the_next_one_is_still_limited() -> None:
    """Many short sections on one deadline, then one that overstays: only that one times
    out, after its own limit, not an earlier section's longer one."""
    deadline = Deadline()
    for _ in range(50):
        async with deadline.within(10):
            await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(3):  # a guard: a 10 s wait would fail it
            async with deadline.within(0.05):
                await asyncio.sleep(5)
    assert loop.time() - start < 2


async def test_each_section_gets_its_whole_limit() -> None:
    """The limit runs from each section's start: back-to-back sections of 0.1 s of work under
    a 0.3 s limit, 1 s in all, never time out (the timer armed by the first moves on)."""
    deadline = Deadline()
    for _ in range(10):
        async with deadline.within(0.3):
            await asyncio.sleep(0.1)


async def test_a_cancel_from_outside_stays_a_cancel() -> None:
    """A task cancelled from outside sees ``CancelledError``, never ``TimeoutError``, even
    when its deadline expired too (as asyncio.timeout)."""
    deadline = Deadline()
    entered = asyncio.Event()

    async def body() -> None:
        async with deadline.within(0.05):
            entered.set()
            await asyncio.sleep(5)

    task = asyncio.create_task(body())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_reschedule_moves_the_running_sections_deadline() -> None:
    """ROLL-6, APPEND-6: accepted input restarts the idle clock (later); an earlier deadline
    fires sooner. ``elapsed`` counts from the last restart."""
    deadline = Deadline()
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(TimeoutError):
        async with deadline.within(0.2):
            await asyncio.sleep(0.1)
            deadline.reschedule(loop.time() + 0.2)  # restarted: 0.3 s in all
            elapsed = deadline.elapsed()
            assert elapsed is not None and elapsed < 0.05
            await asyncio.sleep(5)
    assert loop.time() - start >= 0.28
    start = loop.time()
    with pytest.raises(TimeoutError):
        async with deadline.within(10):
            deadline.reschedule(loop.time() + 0.05)  # earlier than the armed timer
            await asyncio.sleep(5)
    assert loop.time() - start < 2


async def test_a_timer_firing_between_sections_does_nothing() -> None:
    """A section that ended before its deadline leaves its timer armed (moving a deadline is
    the cheap part); when it fires with no section running it does nothing at all, and the
    next section still gets its own limit."""
    loop = asyncio.get_running_loop()
    errors: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _, context: errors.append(context))
    try:
        deadline = Deadline()
        async with deadline.within(0.05):
            pass
        await asyncio.sleep(0.15)  # the timer fires here, outside any section
        async with deadline.within(0.3):
            await asyncio.sleep(0.1)
        with pytest.raises(TimeoutError):
            async with deadline.within(0.05):
                await asyncio.sleep(5)
    finally:
        loop.set_exception_handler(None)
    assert errors == []
