"""A trajectory's stored segments (TOK-8, TOK-43): finish reasons travel with their runs, a cut
answer is stored and reopens the trajectory, and a segment at 0 restarts the chain's."""

from __future__ import annotations

from engine.conversation.trajectory import Trajectory
from engine.store.trajectory import TokenSegment, joined


def _answered(traj: Trajectory, prompt: list[int], answer: list[int], finish: str) -> None:
    traj.given(prompt)
    traj.open = True
    traj.sampled_ids(answer, [-0.5] * len(answer), finish)
    traj.open = False


def test_reasons_survive_a_chain_of_segments() -> None:
    traj = Trajectory("h")
    _answered(traj, [1, 2, 3], [4, 5], "tool")
    first = traj.segment(snapshot=True)
    traj.mark_stored()
    _answered(traj, [6], [7, 8, 9], "length")
    second = traj.segment(snapshot=False)
    assert first is not None and second is not None
    assert second.start == 5 and second.finishes == ["length"]
    chain = joined([first, second])
    assert chain is not None
    back = Trajectory.from_segments(chain)
    assert back.all_ids() == list(range(1, 10))
    assert back.samples() == [(3, 5, "tool"), (6, 9, "length")]
    assert not back.open


def test_a_cut_answer_is_stored_and_reopens() -> None:
    traj = Trajectory("h")
    traj.given([1, 2])
    traj.open = True
    assert traj.segment(snapshot=True) is None  # a prompt with no answer: nothing to store
    traj.cut_short([3, 4], [-0.1, -0.2], "cancelled")
    traj.cut_short([5], [-0.3], "cancelled")  # once only
    segment = traj.segment(snapshot=True)
    assert segment is not None and segment.cut and segment.ids == [1, 2, 3, 4]
    back = Trajectory.from_segments([segment])
    assert back.open and back.samples() == [(2, 4, "cancelled")]


def test_a_segment_at_zero_restarts_the_chain() -> None:
    old = TokenSegment(start=0, ids=[1, 2, 3], sampled=[2, 3], finishes=["stop"])
    fresh = TokenSegment(start=0, ids=[9, 9, 1, 2], sampled=[3, 4], finishes=["tool"])
    later = TokenSegment(start=4, ids=[5, 6], sampled=[5, 6], finishes=["stop"])
    assert joined([old, fresh, later]) == [fresh, later]
    assert joined([old, None, fresh]) == [fresh]  # a gap before a fresh start does not matter
    assert joined([old, None, later]) is None
    assert joined([fresh, TokenSegment(start=3, ids=[1])]) is None
