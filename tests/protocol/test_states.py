"""STATE-1..3: the response lifecycle table is total and closed (h2-style totality check)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.states import (
    TERMINAL_STATES,
    TRANSITIONS,
    IllegalTransition,
    ResponseState,
    Step,
    next_state,
)


@given(st.lists(st.sampled_from(list(Step)), max_size=30))
def test_every_step_sequence_is_legal_or_raises(steps: list[Step]) -> None:
    state = ResponseState.NEW
    for step in steps:
        if (state, step) in TRANSITIONS:
            new = next_state(state, step)
            assert isinstance(new, ResponseState)
            state = new
        else:
            with pytest.raises(IllegalTransition):
                next_state(state, step)  # and the state is unchanged


def test_terminal_states_accept_nothing() -> None:
    for state in TERMINAL_STATES:
        for step in Step:
            assert (state, step) not in TRANSITIONS


def test_every_live_state_can_terminate() -> None:
    live = set(ResponseState) - TERMINAL_STATES - {ResponseState.NEW}
    for state in live:
        assert (state, Step.FAIL) in TRANSITIONS
        assert (state, Step.INCOMPLETE) in TRANSITIONS


def test_created_is_first() -> None:
    for step in Step:
        if step is not Step.CREATE:
            assert (ResponseState.NEW, step) not in TRANSITIONS
