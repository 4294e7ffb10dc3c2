"""A rollout's processed conversation (SPEC: PIPE-1, PIPE-3, PIPE-4).

Its own module because three layers read it: the pipeline writes it, validation looks up its
ledgers, and backends receive it in a ``SampleRequest``. None of them imports another for it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from engine.conversation.carried import CarriedRun
from engine.conversation.footprint import CONTEXT_OVERHEAD, LIST_SLOT, WIRE_ENTRY_OVERHEAD
from engine.conversation.resend import NO_DIGEST, Rolling
from engine.conversation.safety import Finding
from engine.conversation.sealed import SealedRun
from engine.conversation.tokens import TokenArray, TokenBuffer
from engine.conversation.trajectory import Trajectory
from engine.store.records import ChainPoint
from protocol.items import InputItem, ToolCall
from protocol.tools import Toolset


@dataclass(slots=True)
class Wire:
    """Items as one upstream mapping encodes them: ``entries``, the encoded JSON pieces it
    sends; ``covered``, the context items encoded so far; ``state``, the mapping's own
    bookkeeping between steps (where each item's entry sits, what it dropped). ``nbytes``:
    what all of it occupies, charged to the context like its items (MEM-10)."""

    key: object
    entries: list[msgspec.Raw] = field(default_factory=list)
    covered: int = 0
    state: Any = None
    nbytes: int = 0

    def add(self, entry: msgspec.Raw) -> None:
        self.entries.append(entry)  # a Raw object, the bytes it holds, its slot (MEM-10)
        self.nbytes += len(entry) + WIRE_ENTRY_OVERHEAD + LIST_SLOT

    def fork(self) -> Wire:
        """A copy the fork may extend: entries are immutable, the state is the mapping's to copy
        (its ``copy()``) when it has one."""
        state = self.state.copy() if self.state is not None else None
        return Wire(self.key, list(self.entries), self.covered, state, self.nbytes)


@dataclass
class Context:
    """A rollout's processed conversation: items, rendered tokens, tool-call ledger."""

    items: list[InputItem] = field(default_factory=list)
    tokens: TokenBuffer = field(default_factory=TokenBuffer)
    calls: dict[str, ToolCall] = field(default_factory=dict)
    answered: set[str] = field(default_factory=set)
    unanswered: dict[str, ToolCall] = field(default_factory=dict)  # calls awaiting output
    by_id: dict[str, InputItem] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    header_key: tuple[str | None, Toolset] | None = None
    header: TokenArray = field(default_factory=lambda: np.empty(0, dtype=np.int32))
    stored: ChainPoint | None = None  # items[:stored.length] are a stored chain (STORE-5)
    # What the context's items and ledger entries occupy (LIM-21, MEM-10), measured once as
    # each item is committed, so caches bound contexts in bytes without re-measuring.
    nbytes: int = 0
    # The ``tokens`` backend's ids in the model's own tokenizer (TOK-7); None for other backends.
    model_tokens: Trajectory | None = None
    # Sealed runs opened from a stateless input, by the index of their first item, until the
    # ``tokens`` backend replays them into a trajectory (SEAL-4); empty for other backends.
    sealed: dict[int, SealedRun] = field(default_factory=dict)
    # Runs a stateless input carried back on its items (their training fields, TOK-62), by
    # the index of their first item, until the ``tokens`` backend continues from them.
    carried: dict[int, CarriedRun] | None = None  # None: no dict held by every context
    # What the backend that sends the items upstream keeps of their encoding, so a step resends
    # the history without re-encoding it (UP-RESP-6, UP-CHAT-5); None until a step made one.
    wire: Wire | None = None
    # The digest of the items so far, as a resent history is matched against it (COMPAT-7).
    resend: Rolling = NO_DIGEST

    def wire_for(self, key: object) -> Wire:
        """The kept encoding for mapping ``key``; a fresh one (built from the first item again)
        when it was made for another mapping (a chain continued on another route)."""
        wire = self.wire
        if wire is None or wire.key != key:
            wire = self.wire = Wire(key)
        return wire

    @property
    def prompt_tokens(self) -> int:
        return len(self.header) + len(self.tokens)

    @property
    def retained_bytes(self) -> int:
        """What caching this context costs in memory (HYD-2, PARK-7, MEM-10): its items and
        ledgers, the token buffers at their capacity (spare room is memory too), the header
        and the request's instructions and tools it was rendered from (the tools measured once,
        when they were parsed; instructions or tools shared by many contexts, CACHE-5, CACHE-7,
        are charged to each in full)."""
        size = CONTEXT_OVERHEAD + self.nbytes + self.tokens.capacity_bytes + self.header.nbytes
        if self.header_key is not None:
            instructions, tools = self.header_key
            size += tools.nbytes + (sys.getsizeof(instructions) if instructions else 0)
        if self.wire is not None:
            size += self.wire.nbytes
        if self.model_tokens is not None:
            size += self.model_tokens.retained_bytes
        for run in self.sealed.values():
            size += 8 * len(run.ids) + 128  # a list slot each; small ints are cached
        for carried in (self.carried or {}).values():
            size += 8 * (len(carried.prompt) + len(carried.ids)) + 32 * len(carried.ids) + 128
        return size

    def fork(self) -> Context:
        """An independent copy (token array copied once; items shared, they are immutable)."""
        return Context(
            items=list(self.items),
            tokens=self.tokens.copy(),
            calls=dict(self.calls),
            answered=set(self.answered),
            unanswered=dict(self.unanswered),
            by_id=dict(self.by_id),
            findings=list(self.findings),
            header_key=self.header_key,
            header=self.header,
            stored=self.stored,
            nbytes=self.nbytes,
            model_tokens=self.model_tokens.fork() if self.model_tokens is not None else None,
            sealed=dict(self.sealed),  # runs are immutable
            wire=self.wire.fork() if self.wire is not None else None,
            resend=self.resend,  # immutable
        )

    def compact(self) -> None:
        """Give back the token buffers' spare capacity (a suspended rollout may wait long)."""
        self.tokens.compact()
        if self.model_tokens is not None:
            self.model_tokens.ids.compact()  # the model's own ids too (TOK-7)

    def pending_calls(self) -> list[ToolCall]:
        return list(self.unanswered.values())
