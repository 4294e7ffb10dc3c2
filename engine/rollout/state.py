"""A rollout's lifecycle as data (SPEC: ROLL-3, ROLL-5), in the style of ``protocol/states.py``.

One table says which step is legal in which state; ``Rollout`` moves only through ``advance``,
so a bug cannot, say, resume an ended rollout: it raises ``IllegalTransition`` instead. How each
response ended is the response's own (``Turn.status``), not the rollout's.
"""

from __future__ import annotations

import enum

from protocol.states import IllegalTransition


class RolloutState(enum.Enum):
    __hash__ = object.__hash__  # identity hashing, as protocol.states (consulted per step)

    RUNNING = "running"  # sampling, or between steps
    SUSPENDED = "suspended"  # waiting for tool outputs (ROLL-3)
    ENDED = "ended"  # finished, failed, cancelled or retired (ROLL-5): never runs again


class RolloutStep(enum.Enum):
    __hash__ = object.__hash__

    SUSPEND = "suspend"  # stopped at function calls
    WAKE = "wake"  # resumed, or woken by the idle limit to end (APPEND-6)
    END = "end"  # the one ending ran, or the task finished


R, S = RolloutState, RolloutStep
ROLLOUT_TRANSITIONS: dict[tuple[RolloutState, RolloutStep], RolloutState] = {
    (R.RUNNING, S.SUSPEND): R.SUSPENDED,
    (R.SUSPENDED, S.WAKE): R.RUNNING,
    (R.RUNNING, S.END): R.ENDED,
    (R.SUSPENDED, S.END): R.ENDED,  # retired while waiting
    (R.ENDED, S.END): R.ENDED,  # the task's own end after the rollout's ending
}


def advance(state: RolloutState, step: RolloutStep) -> RolloutState:
    try:
        return ROLLOUT_TRANSITIONS[(state, step)]
    except KeyError:
        raise IllegalTransition(
            f"rollout: {step.value} is not allowed when {state.value}"
        ) from None
