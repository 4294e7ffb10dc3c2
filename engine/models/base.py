"""The backend interface: one streaming method; cancellation is task cancellation.

A backend receives the rollout's processed context (items and rendered tokens) and settings, and
yields deltas. It never builds wire events: the rollout hands deltas to the pure stream builder.
What a backend may do beyond streaming is declared on ``Backend`` with its default (its own
compaction, its counters, its own token render, its weights tag), so callers ask the backend,
never probe it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Literal

from engine.conversation.context import Context
from protocol.errors import ProtocolError
from protocol.items import Compaction, InputItem
from protocol.tools import ToolChoice, Toolset

FinishReason = Literal["stop", "tool_calls", "length"]
# In ``Backend.supports``: the backend can run hosted tools (web search, MCP, …; TOOL-4).
HOSTED_TOOLS = "hosted_tools"


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """Reasoning text (REASON-2): consecutive pieces form one ``reasoning`` item, which any
    other delta closes."""

    text: str


@dataclass(frozen=True, slots=True)
class CallStart:
    """Opens a tool call: a function call, or (``custom``) a custom tool call whose ``ArgsDelta``
    text is its free-form input. ``namespace`` names the namespace tool it belongs to."""

    call_id: str
    name: str
    namespace: str | None = None
    custom: bool = False


@dataclass(frozen=True, slots=True)
class ArgsDelta:
    text: str


@dataclass(frozen=True, slots=True)
class CallEnd:
    pass


@dataclass(frozen=True, slots=True)
class Finish:
    """The end of one sampling step.

    Upstream backends report the server's own counts: ``input_tokens`` (its prompt tokens, which
    may differ from our tokenizer's render) and ``cached_tokens``; ``None`` means "not reported,
    use our render". ``usage_estimated`` is true when ``output_tokens`` was counted with our
    tokenizer because the upstream sent no usage.
    """

    reason: FinishReason
    output_tokens: int
    input_tokens: int | None = None
    cached_tokens: int | None = None
    usage_estimated: bool = False
    tokens: StepTokens | None = None  # the ``tokens`` backend's ids of this step (TOK-9)
    reasoning_tokens: int = 0  # of ``output_tokens``, those sampled as reasoning (REASON-3)


@dataclass(frozen=True, slots=True)
class StepTokens:
    """A sampling step in the model's own tokens: the prompt's length, its newly rendered
    part, and the sampled ids with their logprobs."""

    prompt_tokens: int
    prompt_new: list[int]
    sampled: list[int]
    logprobs: list[float | None]


Delta = TextDelta | ReasoningDelta | CallStart | ArgsDelta | CallEnd | Finish


@dataclass(frozen=True, slots=True)
class SampleRequest:
    model: str
    context: Context
    tools: Toolset
    tool_choice: ToolChoice
    parallel_tool_calls: bool
    max_output_tokens: int | None
    temperature: float | None = None  # None: the upstream's default
    top_p: float | None = None


@dataclass(frozen=True)
class CompactRequest:
    model: str
    context: Context  # the prepared context: references resolved, rendered
    keep_round: bool = True  # False for a compaction_trigger (COMPACT-7)


@dataclass(frozen=True)
class Compacted:
    items: list[InputItem]  # the new window: what replaces the context
    item: Compaction  # the compaction item in it (the first, for an upstream's window)
    input_tokens: int
    output_tokens: int


# A create's ``include`` value asking for each step's training fields on its last item (TOK-61).
TRAINING_INCLUDE = "output[*].token_ids"


class Backend(ABC):
    """What every model backend provides: ``stream``; and its optional capabilities, each
    declared here with the default of a backend that lacks it."""

    name: str
    # content kinds it can read ("text", "image", "file") and HOSTED_TOOLS if it runs them
    supports: frozenset[str]
    # It renders the model's own tokens, so the pipeline only estimates counts (TOK-10).
    renders_own_tokens: bool = False
    # Its upstream counts each step's prompt and reports it, so the pipeline only estimates
    # counts and tokenizes nothing on the way in (UP-8).
    reports_usage: bool = False
    # The route's checkpoint tag, stored with each trajectory segment (EXPORT-4).
    weights: str = ""
    # The route's ``training_fields``: every create gets them as if it asked (TOK-61).
    training_fields: bool = False
    # Its own counters (requests, dropped items, renders …), listed by the stats route; None:
    # it keeps none.
    stats: Counter[str] | None = None

    @abstractmethod
    def stream(self, request: SampleRequest) -> AsyncGenerator[Delta, None]:
        """Yield deltas for one sampling step; must end with exactly one ``Finish``.

        Cancellation (the consuming task being cancelled) must stop generation promptly.
        """

    async def compact(self, request: CompactRequest) -> Compacted | None:
        """Its own compaction (COMPACT-5); None: the engine's digest (COMPACT-1)."""
        return None

    def continue_carried(self, ctx: Context, tools: Toolset) -> None:
        """Continue from the token ids the input carried back on its items (TOK-62), or
        refuse them (TOK-63); a backend that renders no tokens of its own drops them."""
        ctx.carried = None

    def count_into(self, counters: Counter[str]) -> None:
        """Join the events it counts to the engine's counters, which ``/metrics`` serves
        (PARSE-3, TOK-33); a backend that counts none joins nothing."""
        return None


class BackendError(Exception):
    """A backend failed. A refusal before any output (``protocol_error()`` not None) reaches the
    client as an ``error`` with the backend's status (MODEL-5); anything else is
    ``response.failed`` / ``server_error``."""

    def protocol_error(self) -> ProtocolError | None:
        """The client-facing error when the request itself was refused (e.g. an upstream 4xx,
        with the upstream's status and a sanitised message); None for a server-side fault."""
        return None

    def failure(self) -> str | None:
        """The message of the ``response.failed`` this fault ends in, when it names its own
        code (``protocol.errors.failure_message``, SPEC §12); None: the generic one."""
        return None
