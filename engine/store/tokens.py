"""A stored response's part of its model-token trajectory (SPEC: TOK-8).

Stored like the context items (STORE-4, STORE-5): a record holds only the tokens its response
added since its stored parent (``start`` = the trajectory's length before them), a snapshot
record all of them (``start`` 0). Hydrating concatenates the chain's segments; a chain with a
missing or non-contiguous segment has no trajectory (the backend then renders the history).
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
    covered: int = 0  # context items the trajectory stands for after this segment
    tail: str = ""  # template text owed after the last sampled ids (its turn close)
    header: str = ""  # digest of the instructions and tools it was rendered with
    prompt: int = 0  # the length of the last prompt sent (the rest was sampled)


def joined(segments: list[TokenSegment | None]) -> list[TokenSegment] | None:
    """The chain's segments when they tile one trajectory from 0, else None."""
    length = 0
    out: list[TokenSegment] = []
    for segment in segments:
        if segment is None or segment.start != length:
            return None
        length += len(segment.ids)
        out.append(segment)
    return out or None
