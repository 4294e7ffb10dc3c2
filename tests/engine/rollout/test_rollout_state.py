"""The rollout's lifecycle table (ROLL-1, ROLL-3, ROLL-5): every step outside it is refused."""

from __future__ import annotations

import pytest

from engine.rollout.state import ROLLOUT_TRANSITIONS, RolloutState, RolloutStep, advance
from protocol.states import IllegalTransition

R, S = RolloutState, RolloutStep


def test_the_lifecycle_runs_suspends_wakes_and_ends() -> None:
    """ROLL-3: a rollout suspends at calls and wakes; ROLL-5: it ends from either."""
    state = advance(R.RUNNING, S.SUSPEND)
    assert state is R.SUSPENDED
    assert advance(state, S.WAKE) is R.RUNNING
    assert advance(state, S.END) is R.ENDED
    assert advance(R.ENDED, S.END) is R.ENDED  # the task's own end after the rollout's ending


@pytest.mark.parametrize(
    "state, step",
    [(s, t) for s in RolloutState for t in RolloutStep if (s, t) not in ROLLOUT_TRANSITIONS],
)
def test_every_other_step_is_illegal(state: RolloutState, step: RolloutStep) -> None:
    """ROLL-1: an ended rollout never runs again; nothing wakes a running one."""
    with pytest.raises(IllegalTransition):
        advance(state, step)


def test_the_table_refuses_the_steps_that_matter() -> None:
    """ROLL-5: a retired (ended) rollout cannot be woken or suspended again."""
    illegal = {
        (R.ENDED, S.WAKE),
        (R.ENDED, S.SUSPEND),
        (R.RUNNING, S.WAKE),
        (R.SUSPENDED, S.SUSPEND),
    }
    assert not illegal & ROLLOUT_TRANSITIONS.keys()
