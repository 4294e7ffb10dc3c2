"""The backend interface: one streaming method; cancellation is task cancellation.

A backend receives the rollout's processed context (items and rendered tokens) and settings, and
yields deltas. It never builds wire events: the rollout hands deltas to the pure stream builder.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal, Protocol

from engine.pipeline import Context
from protocol.response import Tool, ToolChoice

FinishReason = Literal["stop", "tool_calls", "length"]


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str


@dataclass(frozen=True, slots=True)
class CallStart:
    call_id: str
    name: str


@dataclass(frozen=True, slots=True)
class ArgsDelta:
    text: str


@dataclass(frozen=True, slots=True)
class CallEnd:
    pass


@dataclass(frozen=True, slots=True)
class Finish:
    reason: FinishReason
    output_tokens: int


Delta = TextDelta | CallStart | ArgsDelta | CallEnd | Finish


@dataclass(frozen=True, slots=True)
class SampleRequest:
    model: str
    context: Context
    tools: list[Tool]
    tool_choice: ToolChoice
    parallel_tool_calls: bool
    max_output_tokens: int | None
    max_tool_calls: int | None = None


class Backend(Protocol):
    """What every model backend provides."""

    name: str
    supports: frozenset[str]  # content kinds it can read: "text", "image", "file"

    def stream(self, request: SampleRequest) -> AsyncIterator[Delta]:
        """Yield deltas for one sampling step; must end with exactly one ``Finish``.

        Cancellation (the consuming task being cancelled) must stop generation promptly.
        """
        ...


class BackendError(Exception):
    """A backend failed; reported to clients as ``response.failed`` / ``server_error``."""
