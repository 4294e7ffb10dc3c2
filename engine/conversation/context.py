"""A rollout's processed conversation (SPEC: PIPE-1, PIPE-3, PIPE-4).

Its own module because three layers read it: the pipeline writes it, validation looks up its
ledgers, and backends receive it in a ``SampleRequest``. None of them imports another for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec
import numpy as np

from engine.conversation.footprint import CONTEXT_OVERHEAD, LIST_SLOT, WIRE_ENTRY_OVERHEAD
from engine.conversation.safety import Finding
from engine.conversation.sealed import SealedRun
from engine.conversation.tokens import TokenArray, TokenBuffer
from engine.conversation.trajectory import Trajectory
from engine.store.records import ChainPoint
from protocol.items import InputItem, ToolCall
from protocol.tools import Toolset


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
    # Each item as the upstream that sends them reads it (a Responses ``input`` entry, encoded
    # JSON, or the kind it is dropped as), aligned with ``items``: built once per item, so a
    # step resends the history without re-encoding it (UP-RESP-6). ``wire_key`` names the
    # mapping; ``wire_bytes`` is what the entries occupy (charged like the items, MEM-10).
    wire: list[msgspec.Raw | str] = field(default_factory=list)
    wire_key: object = None
    wire_bytes: int = 0

    def wire_for(self, key: object) -> list[msgspec.Raw | str]:
        """The encoded items for mapping ``key``; empty (rebuilt from the first item) when they
        were made for another mapping (a chain continued on another route)."""
        if self.wire_key != key:
            self.wire, self.wire_key, self.wire_bytes = [], key, 0
        return self.wire

    def add_wire(self, entry: msgspec.Raw | str) -> None:
        self.wire.append(entry)
        if entry.__class__ is not str:  # a Raw object and the bytes it holds (MEM-10)
            self.wire_bytes += len(entry) + WIRE_ENTRY_OVERHEAD
        self.wire_bytes += LIST_SLOT

    @property
    def prompt_tokens(self) -> int:
        return len(self.header) + len(self.tokens)

    @property
    def retained_bytes(self) -> int:
        """What caching this context costs in memory (HYD-2, PARK-7, MEM-10): its items and
        ledgers, the token buffers at their capacity (spare room is memory too), the header."""
        size = CONTEXT_OVERHEAD + self.nbytes + self.tokens.capacity_bytes + self.header.nbytes
        size += self.wire_bytes
        if self.model_tokens is not None:
            size += self.model_tokens.retained_bytes
        for run in self.sealed.values():
            size += 8 * len(run.ids) + 128  # a list slot each; small ints are cached
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
            wire=list(self.wire),  # entries are immutable
            wire_key=self.wire_key,
            wire_bytes=self.wire_bytes,
        )

    def compact(self) -> None:
        """Give back the token buffers' spare capacity (a suspended rollout may wait long)."""
        self.tokens.compact()
        if self.model_tokens is not None:
            self.model_tokens.ids.compact()  # the model's own ids too (TOK-7)

    def pending_calls(self) -> list[ToolCall]:
        return list(self.unanswered.values())
