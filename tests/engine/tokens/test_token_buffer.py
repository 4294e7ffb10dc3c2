"""MEM-1: what a suspended rollout's token buffer keeps, and what growing it every turn costs.

A buffer is cut at each suspension (``Context.compact``) and grows by doubling when a turn's
tokens do not fit. Cut to a fixed slack, a rollout that adds more than that slack each turn
(Codex: ~1,800 tokens a turn) copied its whole buffer twice per turn: doubled by the turn,
cut at the suspension. The headroom grows with the buffer (an eighth of it, at least 1,024
tokens), so the copies are amortised over many turns while a suspended buffer still holds
little more than it uses.
"""

from __future__ import annotations

import numpy as np

from engine.conversation.tokens import TokenBuffer

ARRAY_HEADER = 112  # what ``capacity_bytes`` adds to the ids' own bytes


def _capacity(buffer: TokenBuffer) -> int:
    return (buffer.capacity_bytes - ARRAY_HEADER) // 4


def _headroom(length: int) -> int:
    return max(1024, length // 8)


def test_a_cut_keeps_an_eighth_at_least_1024_and_the_ids() -> None:
    for length in (10, 3_000, 20_000, 200_000):
        buffer = TokenBuffer(8 * length + 10_000)
        ids = np.arange(length, dtype=np.int32)
        buffer.extend(ids)
        buffer.compact()
        assert _capacity(buffer) == length + _headroom(length)
        assert np.array_equal(buffer.view(), ids)  # nothing lost in the cut
        buffer.compact()  # within twice the headroom: left as it is
        assert _capacity(buffer) == length + _headroom(length)


def test_a_buffer_within_twice_its_headroom_is_not_copied() -> None:
    buffer = TokenBuffer(300_000)
    buffer.extend(np.zeros(100_000, dtype=np.int32))
    buffer.compact()
    before = _capacity(buffer)
    assert before == 100_000 + _headroom(100_000)
    # fits: no growth, and the cut leaves it alone
    buffer.extend(np.zeros(_headroom(100_000) - 1, dtype=np.int32))
    buffer.compact()
    assert _capacity(buffer) == before


def test_growing_every_turn_copies_the_buffer_a_few_times_not_twice_a_turn() -> None:
    buffer = TokenBuffer(1024)
    turn = np.zeros(1_800, dtype=np.int32)
    changes = 0
    for _ in range(200):  # a long agent rollout: 1,800 tokens a turn, a suspension after each
        capacity = _capacity(buffer)
        buffer.extend(turn)
        grown = _capacity(buffer)
        buffer.compact()
        changes += (grown != capacity) + (_capacity(buffer) != grown)
        assert _capacity(buffer) - len(buffer) <= 2 * _headroom(len(buffer))
    assert len(buffer) == 360_000
    assert changes <= 70  # measured 60; cut to a fixed 1,024-token slack: 398 (two a turn)


def test_an_estimated_count_is_a_length_not_stored_ids() -> None:
    """MEM-1 / UP-8: an upstream route's context counts its estimate; no placeholder ids are
    written, so a long rollout's buffer holds nothing (it held 4 bytes a token of zeros)."""
    buffer = TokenBuffer()
    empty = buffer.capacity_bytes
    for _ in range(60):  # the codex scenario's size: ~1,800 tokens a turn
        buffer.pad(1_800)
        buffer.compact()
    assert len(buffer) == 108_000
    assert buffer.capacity_bytes == empty
    assert len(buffer.view()) == 0
    ids = np.arange(5, dtype=np.int32)
    buffer.extend(ids)  # a route that renders ids (the simulator) after an estimating one
    assert len(buffer) == 108_005 and np.array_equal(buffer.view(), ids)
    clone = buffer.copy()  # a fork keeps both: the count and the ids
    assert len(clone) == 108_005 and np.array_equal(clone.view(), ids)
    assert clone.capacity_bytes == (5 + 1024) * 4 + ARRAY_HEADER
