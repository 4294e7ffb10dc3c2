"""A rollout's recent sampling steps, for the inspector's turn history (SPEC: INSP-5).

One small record per sampling step (never per token), in a bounded deque owned by the rollout:
the inspector copies it on demand, so a long rollout costs at most ``MAX_TURNS`` records.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from engine.conversation.pipeline import TurnLog

MAX_TURNS = 32  # the newest steps of a rollout are kept; ``count`` says how many there were
# Stages that run before the model samples (OBS-1): the step's pre-inference time.
PRE_STAGES = ("route", "queue", "header", "validate", "scan", "render")


@dataclass(frozen=True, slots=True)
class TurnRecord:
    """One sampling step: which response it belongs to, what it rendered, read and wrote."""

    index: int  # 1-based step number within the rollout
    response_id: str
    started_at: float  # Unix time the step started sampling
    rendered_tokens: int  # tokens rendered fresh for this step (the rest of the prompt was held)
    prompt_tokens: int
    output_tokens: int
    calls: tuple[str, ...]  # names of the function calls the step made
    finish: str  # "tool_calls", "stop", "length" or "steered" (STEER-3)
    pre_seconds: float  # pre-inference since the previous step (PRE_STAGES)
    ttft_seconds: float | None  # None when the model sent nothing
    model_seconds: float


class TurnHistory:
    """The bounded turn log of one rollout; only the rollout writes it."""

    __slots__ = ("_log", "_pre_seen", "count", "turns")

    def __init__(self, maxlen: int = MAX_TURNS) -> None:
        self.turns: deque[TurnRecord] = deque(maxlen=maxlen)
        self.count = 0
        self._log: TurnLog | None = None
        self._pre_seen = 0.0

    def pre_seconds(self, log: TurnLog) -> float:
        """Pre-inference seconds in ``log`` not yet attributed to a step: a standard-mode turn
        has its own log, an append-mode rollout keeps adding to one."""
        total = sum(log.seconds.get(stage, 0.0) for stage in PRE_STAGES)
        seen = self._pre_seen if log is self._log else 0.0
        self._log, self._pre_seen = log, total
        return max(total - seen, 0.0)

    def add(self, record: TurnRecord) -> None:
        self.turns.append(record)
        self.count += 1

    def next_index(self) -> int:
        return self.count + 1
