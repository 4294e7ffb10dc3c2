"""A stored response's part of its model-token trajectory (SPEC: TOK-8).

Stored like the context items (STORE-4, STORE-5): a record holds only the tokens its response
added since its stored parent (``start`` = the trajectory's length before them), a snapshot
record all of them (``start`` 0). Hydrating concatenates the chain's segments; a segment that
starts at 0 begins a trajectory afresh (it was rendered anew: the ones before it are history);
a chain with a missing or non-contiguous segment has no trajectory (the backend then renders
the history).
"""

from __future__ import annotations

import msgspec


class TokenSegment(msgspec.Struct, kw_only=True):
    start: int  # trajectory length before ``ids``
    ids: list[int]
    # ``[begin, end)`` offsets, in the whole trajectory, of the runs of ``ids`` the model
    # sampled (the rest was rendered from given items); flattened pairs.
    sampled: list[int] = []
    logprobs: list[float | None] = []  # one per sampled id of this segment, in order
    # Why each sampled run of this segment ended (TOK-43): stop, tool, length, cancelled,
    # error; a run split across two records has its reason in the later one.
    finishes: list[str] = []
    cut: bool = False  # the last answer was cut short: the next turn renders afresh
    covered: int = 0  # context items the trajectory stands for after this segment
    tail: str = ""  # template text owed after the last sampled ids (its turn close)
    header: str = ""  # digest of the instructions and tools it was rendered with
    prompt: int = 0  # the length of the last prompt sent (the rest was sampled)
    # The route's ``weights`` tag when this segment was sampled (EXPORT-4): which checkpoint
    # produced it, for a trainer reading the export; "" when the route names none.
    weights: str = ""


def joined(segments: list[TokenSegment | None]) -> list[TokenSegment] | None:
    """The segments of the chain's last trajectory when they tile it from 0, else None. A
    segment at 0 starts a trajectory afresh, so a gap before it does not matter."""
    length = 0
    out: list[TokenSegment] | None = []
    for segment in segments:
        if segment is not None and segment.start == 0:
            length, out = 0, []  # rendered anew: what came before is history
        if out is None or segment is None or segment.start != length:
            out = None  # a gap: nothing continues until a fresh start
            continue
        length += len(segment.ids)
        out.append(segment)
    return out or None
