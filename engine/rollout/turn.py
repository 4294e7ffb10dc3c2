"""What a rollout works with: one response being produced (``Turn``), its sampling settings
(``Settings``), the rollout's mode, and where events go (``Sink``) (SPEC: ROLL-1, COMPAT-6,
APPEND-1)."""

from __future__ import annotations

import asyncio
import enum
import time
from dataclasses import dataclass, field
from typing import Literal

from engine.conversation.pipeline import TurnLog
from engine.conversation.trajectory import StepFields
from engine.models.base import FinishReason
from engine.observe.accounting import UsageTally
from engine.observe.tracing import TurnTrace
from engine.store.conversations import Joined
from protocol import events as ev
from protocol.events import Sink
from protocol.items import InputItem
from protocol.stream import ResponseStream
from protocol.tools import ToolChoice, Toolset


class ClientGone(Exception):
    """The peer went away while we were writing to it."""


class TurnNotStored(Exception):
    """A ``store: true`` response could not be stored: its terminal frame was replaced by an
    ``error`` (STORE-6, STORE-8) and the rollout ends."""


class _Detached:
    """The sink of a parked rollout: its connection is gone, nothing can be sent."""

    async def send(self, event: ev.ServerEvent) -> None:
        raise ClientGone


DETACHED: Sink = _Detached()


SampleEnd = FinishReason | Literal["steered"]


class Mode(enum.Enum):
    STANDARD = "standard"  # compat: one response per sampling turn
    APPEND = "append"  # experimental: one response for the whole rollout


MODES = {mode.value: mode for mode in Mode}  # by wire value: a dict lookup, not an Enum call


@dataclass
class Settings:
    """Sampling settings; in standard mode each continuation may change them."""

    model: str
    instructions: str | None
    tools: Toolset
    tool_choice: ToolChoice
    parallel_tool_calls: bool
    max_output_tokens: int | None
    store: bool
    temperature: float | None = None
    top_p: float | None = None
    compact_threshold: int | None = None  # context_management (COMPACT-3)
    compact_now: bool = False  # the input ended with a compaction_trigger (COMPACT-7)
    include_tokens: bool = False  # ``include: ["rollout.token_ids"]`` (TOK-9)
    # ``include: ["output[*].token_ids"]`` or the route's ``training_fields`` (TOK-60)
    training_fields: bool = False
    seal_reasoning: bool = False  # ``include: ["reasoning.encrypted_content"]`` (SEAL-1)


def _future() -> asyncio.Future[str]:
    return asyncio.get_running_loop().create_future()


@dataclass
class Turn:
    """One response being produced: where its events go, its input, its own usage, and how it
    ended (``status``: ``in_progress`` until its terminal event, then what ``done`` resolves
    with)."""

    stream: ResponseStream
    sink: Sink
    input_items: list[InputItem]
    done: asyncio.Future[str] = field(default_factory=_future)
    tally: UsageTally = field(default_factory=UsageTally)
    log: TurnLog = field(default_factory=TurnLog)
    # Set before ``done`` resolves when steering continues the rollout in a new response.
    successor: Turn | None = None
    status: str = "in_progress"
    trace: TurnTrace | None = None  # its span, with tracing on (OTEL-2)
    conversation: Joined | None = None  # a create on a conversation, until it ends (CONV-5)
    # Its terminal frame is in the sink (the send may still wait for the socket): from here on
    # a steer may be refused as already completed, after that frame (STEER-7).
    terminal_out: bool = False
    # A step's training fields still owed to an item cut open (length, cancel; TOK-60).
    training: tuple[int, StepFields] | None = None  # (the step's first output index, …)
    _out: asyncio.Future[None] | None = None  # made only for a steer that waits for it

    def settle(self, status: str | None = None) -> None:
        """Resolve ``done`` (once) with ``status``, or with the status it ended with."""
        if status is not None:
            self.status = status
        if not self.done.done():
            self.done.set_result(self.status)
        self._wake()

    def hand_over(self) -> None:
        """The terminal frame goes into the sink now (the caller sends it next, STEER-7)."""
        self.terminal_out = True
        self._wake()

    async def terminal_written(self) -> None:
        """Until the terminal frame is in the sink, or the turn ended without one (STEER-7):
        between the two come its durable write (STORE-6) and the conversation's append."""
        if self.terminal_out or self.done.done():
            return
        if self._out is None:
            self._out = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._out)

    def _wake(self) -> None:
        if self._out is not None and not self._out.done():
            self._out.set_result(None)


def now() -> int:
    return int(time.time())


def share_echoes(previous: Turn, turn: Turn) -> None:
    """A continuation that resends the previous turn's very instructions and tools (the raw
    bytes, TOOL-1: byte-equal, so the echo is unchanged) echoes the previous objects, whose JSON
    is encoded once per object (CODEC-6) and reused by every snapshot of every turn instead of
    being encoded again (~15 KB of instructions for a Codex-sized request)."""
    old, new = previous.stream.response, turn.stream.response
    if new.instructions == old.instructions:
        new.instructions = old.instructions
    if new.tools == old.tools:
        new.tools = old.tools
