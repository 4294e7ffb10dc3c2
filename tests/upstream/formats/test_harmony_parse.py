"""HARMONY-3: the Python reading of harmony's parser is harmony's ``StreamableParser`` id by id.

Both are fed the same ids, drawn from harmony's markers, the words of its headers, text whose
ids split UTF-8 sequences, arbitrary ordinary and special ids and ids harmony cannot decode.
After every id they agree on whether it was rejected and, while neither has, on the current
channel, recipient and content delta. The reader itself is checked on harmony's own parser
too (the route's path when bpe-openai does not give harmony's ids)."""

from __future__ import annotations

import contextlib
from collections import Counter

import pytest
from hypothesis import event, example, given
from hypothesis import strategies as st
from openai_harmony import HarmonyError, Role, StreamableParser

from engine.models.base import ReasoningDelta
from engine.models.tokens import harmony
from engine.models.tokens.harmony import HarmonyReader, harmony_encoding, harmony_parser
from engine.models.tokens.harmony_parse import HarmonyParseError, HarmonyParser

MARKERS = [
    "<|start|>",
    "<|channel|>",
    "<|message|>",
    "<|end|>",
    "<|call|>",
    "<|return|>",
    "<|constrain|>",
    "<|endoftext|>",
    "<|reserved_200013|>",
]
WORDS = [
    "analysis",
    "commentary",
    "final",
    "assistant",
    "user",
    "tool",
    "developer",
    "system",
    "bogus",
    " to=functions.get_weather",
    "to=functions.f",
    " to=browser.search",
    "functions.x",
    "json",
    " ",
    "  ",
    "\t",
    "\n",
    "\x0b",
    "\x1c",
    "\u3000",
    "<",
    "x",
    '{"a": 1}',
    "é",
    "東京",
    "🙂",
    "\ufffd",
    "a b c",
]


def _ids(text: str) -> list[int]:
    ids: list[int] = harmony_encoding().encode(text, allowed_special="all")
    return ids


def _pieces() -> st.SearchStrategy[list[int]]:
    marker = st.sampled_from(MARKERS).map(_ids)
    word = st.sampled_from(WORDS).map(_ids)
    ordinary = st.integers(0, 199_997).map(lambda i: [i])
    # ids whose bytes are parts of UTF-8 sequences: each byte of a multi-byte character alone
    partial = st.sampled_from(["é", "東", "🙂", "€"]).map(
        lambda ch: [i for b in ch.encode() for i in _ids_of_byte(b)]
    )
    odd = st.sampled_from([199_998, 200_000, 201_088, 201_089, 300_000]).map(lambda i: [i])
    return st.one_of(marker, marker, word, word, ordinary, partial, odd)


def _ids_of_byte(byte: int) -> list[int]:
    table = harmony._token_bytes(harmony_encoding())
    assert table is not None
    found = [i for i in range(256, 1024) if table(i) == bytes([byte])]
    return found[:1] or [byte]  # o200k has every single byte as an id below 256 too


def _state(parser: HarmonyParser | StreamableParser) -> tuple[str | None, ...]:
    return parser.current_channel, parser.current_recipient, parser.last_content_delta


def _split(text: str) -> list[int]:
    """``text``'s UTF-8 bytes, one id per byte: every multi-byte character split across ids."""
    return [i for b in text.encode() for i in _ids_of_byte(b)]


FINAL = "<|channel|>final<|message|>"


@given(st.lists(_pieces(), max_size=24))
# Cases a short run may not draw (each kills a mutation in tools/mutants.toml): a header word
# split only on Unicode whitespace, an id harmony cannot decode inside content, then more
# content, and a character whose bytes arrive in separate ids.
@example([_ids("<|channel|>commentary to=functions.f\x0bjson<|message|>{}<|call|>")])
@example([_ids(f"{FINAL}a"), [201_089], _ids("b<|end|>")])
@example([_ids(FINAL), _split("é東🙂"), _ids("<|end|>")])
def test_the_python_parser_is_harmonys_parser(pieces: list[list[int]]) -> None:
    encoding = harmony_encoding()
    theirs = StreamableParser(encoding, Role.ASSISTANT)
    ours = harmony_parser(encoding)
    assert isinstance(ours, HarmonyParser)
    for token in [t for piece in pieces for t in piece]:
        try:
            theirs.process(token)
            rejected = False
        except HarmonyError:
            rejected = True
        with pytest.raises(HarmonyParseError) if rejected else contextlib.nullcontext():
            ours.process(token)
        if rejected:
            event("rejected")
            return
        assert _state(ours) == _state(theirs), token
        if ours.current_recipient is not None:
            event("a recipient parsed")
        if ours.last_content_delta is not None:
            event("a content delta")


def test_token_bytes_are_harmonys() -> None:
    """The ordinary ranks end where harmony's special ids begin; a special id is its text."""
    encoding = harmony_encoding()
    table = harmony._token_bytes(encoding)
    assert table is not None
    specials = [_ids(text)[0] for text in encoding.special_tokens_set]
    assert min(specials) == 199_998 and max(specials) == 201_088
    assert (
        table(200_006) == b"<|start|>"
        and table(199_997) == encoding.decode_utf8([199_997]).encode()
    )
    assert table(201_089) is None


HARMONY_SAMPLE = (
    "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant"
    "<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "Paris"}<|call|>'
)


@pytest.mark.parametrize("ours", [True, False], ids=["python", "harmony"])
def test_the_reader_reads_the_same_on_either_parser(
    ours: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not ours:
        monkeypatch.setattr(harmony, "_token_bytes", lambda encoding: None)
    reader = HarmonyReader(harmony_encoding(), Counter())
    assert isinstance(reader._parser, HarmonyParser) is ours
    deltas = reader.feed(_ids(HARMONY_SAMPLE)) + reader.finish()
    kinds = [type(d).__name__ for d in deltas]
    reasoning = "".join(d.text for d in deltas if isinstance(d, ReasoningDelta))
    assert reasoning == "Need the weather."
    assert kinds[-3:] == ["CallStart", "ArgsDelta", "CallEnd"]
    assert reader.calls == 1 and reader.ended_in_call
    assert reader.reasoning_tokens == len(_ids("<|message|>Need the weather.<|end|>"))


@pytest.mark.parametrize("ours", [True, False], ids=["python", "harmony"])
@pytest.mark.parametrize("token", [-1, 2**32, 2**40, 201_089, 300_000])
def test_an_id_harmony_cannot_decode_is_malformed_not_a_crash(
    token: int, ours: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upstream's JSON may carry any integer: outside harmony's vocabulary (HarmonyError) or
    outside u32 (OverflowError from harmony's parser). Either is a malformed header whose ids
    stay text, U+FFFD for the id (HARMONY-4), on either parser."""
    if not ours:
        monkeypatch.setattr(harmony, "_token_bytes", lambda encoding: None)
    stats: Counter[str] = Counter()
    reader = HarmonyReader(harmony_encoding(), stats)
    ids = [*_ids("<|channel|>final<|message|>hi"), token, *_ids("<|end|><|start|>assistant")]
    ids += [token, *_ids("<|message|>x<|end|>")]  # an id in a header: the header is malformed
    deltas = reader.feed(ids) + reader.finish()
    text = "".join(getattr(d, "text", "") for d in deltas)
    assert text.startswith("hi") and text.endswith("<|start|>assistant\ufffd<|message|>x<|end|>"), (
        text
    )
    assert stats["harmony.malformed"] == 1
