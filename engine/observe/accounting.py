"""Usage tallies, safety reports and ledger records (SPEC: USE-1..USE-3, SAFE-4, POST-3)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import msgspec

from engine.conversation.pipeline import TurnLog
from engine.conversation.safety import Finding
from engine.models.base import Finish
from engine.observe.postinference import UsageRecord
from protocol.response import (
    InputTokensDetails,
    OutputTokensDetails,
    SafetyFinding,
    SafetyReport,
    Usage,
)


@dataclass
class UsageTally:
    """Token usage and sampling counts of one response, or of a whole rollout.

    ``input_tokens`` adds the prompt length of every sampling step; ``cached_tokens`` the part of
    it that was not rendered fresh for this request (USE-1, USE-2)."""

    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0  # of output_tokens (REASON-3)
    samples: int = 0
    tool_calls: int = 0
    estimated: bool = False  # some output was counted with our tokenizer (USE-3)

    def count_prompt(self, prompt: int, cached: int) -> None:
        """One sampling step (or warmup) read ``prompt`` tokens, ``cached`` of them not rendered
        fresh for this request."""
        self.input_tokens += prompt
        self.cached_tokens += cached

    def count_finish(self, finish: Finish, prompt: int, cached: int) -> None:
        """Add a sampling step's counts; the backend's own prompt and cache counts, when it
        reports them, replace our render's estimate (UP-7)."""
        self.output_tokens += finish.output_tokens
        self.reasoning_tokens += finish.reasoning_tokens
        if finish.input_tokens is not None:
            self.input_tokens += finish.input_tokens - prompt
        if finish.cached_tokens is not None:
            self.cached_tokens += finish.cached_tokens - cached
        elif finish.input_tokens is not None and prompt:
            # its prompt in its own tokens, ours an estimate: the share carried over (USE-2)
            self.cached_tokens += finish.input_tokens * cached // prompt - cached
        self.estimated = self.estimated or finish.usage_estimated

    def usage(self) -> Usage:
        return Usage(
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            total_tokens=self.input_tokens + self.output_tokens,
            input_tokens_details=InputTokensDetails(cached_tokens=self.cached_tokens),
            output_tokens_details=OutputTokensDetails(reasoning_tokens=self.reasoning_tokens),
            estimated=True if self.estimated else msgspec.UNSET,
        )


def safety_report(policy: str, findings: list[Finding]) -> SafetyReport | None:
    """The ``safety`` field of a response: null when the scan found nothing (SAFE-4)."""
    if not findings:
        return None
    return SafetyReport(
        policy=policy,
        findings=[SafetyFinding(f.kind, f.item_index, f.score) for f in findings],
    )


@dataclass(frozen=True, slots=True)
class RolloutFacts:
    """What a ledger record says about the rollout it bills, as values (not the rollout)."""

    rollout_id: str
    mode: str  # "append" | "standard"
    model: str
    status: str
    stage_tokens: Mapping[str, int]  # tokens rendered per pipeline path, whole rollout
    resume_tokens: Sequence[int]  # tokens rendered by each incremental offer


def usage_record(
    facts: RolloutFacts,
    response_ids: list[str],
    tally: UsageTally,
    log: TurnLog,
    stage_runs: dict[str, int],
) -> UsageRecord:
    return UsageRecord(
        rollout_id=facts.rollout_id,
        mode=facts.mode,
        model=facts.model,
        response_ids=list(response_ids),
        status=facts.status,
        input_tokens=tally.input_tokens,
        cached_tokens=tally.cached_tokens,
        output_tokens=tally.output_tokens,
        samples=tally.samples,
        tool_calls=tally.tool_calls,
        safety_findings=dict(log.finding_kinds),
        stage_seconds=dict(log.seconds),
        stage_runs=stage_runs,
        stage_tokens=dict(facts.stage_tokens),
        resume_tokens=list(facts.resume_tokens),
    )
