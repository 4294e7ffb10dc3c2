"""Which of a connection's responses have ended, for precise steer and append errors
(STEER-7, APPEND-5): ``response_already_completed`` rather than ``response_not_found``."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from engine.rollout.coroutine import Rollout

RECENT = 64  # ended ids remembered per connection (SPEC §4 limits)


def ended_with(rollout: Rollout, response_id: str) -> bool:
    """``response_id`` is the rollout's current response and it ended: its terminal frame is
    written, though the lane may not have heard yet (its send still waits for the socket)."""
    return rollout.turn.stream.id == response_id and not rollout.steerable(response_id)


class Ended:
    """The last ``RECENT`` responses of this connection to reach their terminal event, and
    the last ``RECENT`` append-mode ones among them, both bounded by count of short ids."""

    __slots__ = ("_appends", "_ids")

    def __init__(self) -> None:
        self._ids: deque[str] = deque(maxlen=RECENT)
        self._appends: deque[str] = deque(maxlen=RECENT)

    def add(self, response_id: str, *, append: bool) -> None:
        self._ids.append(response_id)
        if append:
            self._appends.append(response_id)

    def response(self, response_id: str, rollouts: Iterable[Rollout]) -> bool:
        """Any response of this connection that ended (STEER-7)."""
        return response_id in self._ids or any(ended_with(r, response_id) for r in rollouts)

    def append(self, response_id: str, target: Rollout | None) -> bool:
        """An append-mode response of this connection that ended (APPEND-5)."""
        if response_id in self._appends:
            return True
        return target is not None and ended_with(target, response_id)
