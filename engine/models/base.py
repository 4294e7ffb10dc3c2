"""The backend interface: one streaming method; cancellation is task cancellation.

A backend receives the rollout's processed context (items and rendered tokens) and settings, and
yields deltas. It never builds wire events: the rollout hands deltas to the pure stream builder.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Literal, Protocol

from engine.conversation.context import Context
from protocol.errors import ProtocolError
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


class Backend(Protocol):
    """What every model backend provides."""

    name: str
    # content kinds it can read ("text", "image", "file") and HOSTED_TOOLS if it runs them
    supports: frozenset[str]

    def stream(self, request: SampleRequest) -> AsyncGenerator[Delta, None]:
        """Yield deltas for one sampling step; must end with exactly one ``Finish``.

        Cancellation (the consuming task being cancelled) must stop generation promptly.
        """
        ...


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
