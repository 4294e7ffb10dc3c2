"""Response lifecycle as data (SPEC: STATE-1..STATE-3), in the style of h11's ``_state.py``.

One table says which lifecycle step is legal in which state. The stream builder consults it for
every event it emits, so an engine bug can never put an illegal sequence on the wire; it raises
``IllegalTransition`` instead (an internal fault, reported to clients as a generic server error).
"""

from __future__ import annotations

import enum


class ResponseState(enum.Enum):
    # Identity hashing (members are singletons and compare by identity): ``Enum.__hash__`` is
    # Python code, and the transition table is consulted for every event (two hashes each).
    __hash__ = object.__hash__

    NEW = "new"
    CREATED = "created"
    IN_PROGRESS = "in_progress"
    SUSPENDED = "suspended"  # experimental mode: waiting for tool outputs (response.done sent)
    COMPLETED = "completed"
    FAILED = "failed"
    INCOMPLETE = "incomplete"


class Step(enum.Enum):
    __hash__ = object.__hash__  # as ResponseState's

    CREATE = "response.created"
    START = "response.in_progress"
    OUTPUT = "output"  # any item / part / delta event
    SUSPEND = "response.done"
    RESUME = "resume"  # no wire event: sampling continues in the same response
    NOTICE = "notice"  # inject.created / inject.failed / a mid-stream error event
    COMPLETE = "response.completed"
    FAIL = "response.failed"
    INCOMPLETE = "response.incomplete"


S, T = ResponseState, Step
TERMINAL_STATES = frozenset({S.COMPLETED, S.FAILED, S.INCOMPLETE})
_LIVE = (S.CREATED, S.IN_PROGRESS, S.SUSPENDED)

TRANSITIONS: dict[tuple[ResponseState, Step], ResponseState] = {
    (S.NEW, T.CREATE): S.CREATED,
    (S.CREATED, T.START): S.IN_PROGRESS,
    (S.IN_PROGRESS, T.OUTPUT): S.IN_PROGRESS,
    (S.IN_PROGRESS, T.SUSPEND): S.SUSPENDED,
    (S.SUSPENDED, T.RESUME): S.IN_PROGRESS,
    **{(state, T.NOTICE): state for state in _LIVE},
    **{(state, T.FAIL): S.FAILED for state in _LIVE},
    **{(state, T.INCOMPLETE): S.INCOMPLETE for state in _LIVE},
    # A warmup (generate=false) completes straight from CREATED (WS-9).
    (S.CREATED, T.COMPLETE): S.COMPLETED,
    (S.IN_PROGRESS, T.COMPLETE): S.COMPLETED,
}


class IllegalTransition(Exception):
    """An engine bug: the requested step is not legal in the current state."""


def next_state(state: ResponseState, step: Step) -> ResponseState:
    try:
        return TRANSITIONS[(state, step)]
    except KeyError:
        raise IllegalTransition(f"{step.value} is not allowed in state {state.value}") from None
