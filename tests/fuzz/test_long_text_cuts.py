"""TOK-51: cutting a text at the boundaries ``encode_long`` picks never changes its tokens.

The encoder's real limits (1,000,000 characters, 200,000 tokens) are too large to generate
thousands of times, so the cut size is generated too, from 1 character up: every generated text
is near or over its cut size, and each cut lands where a real-size one would (after a newline
before a letter or digit, at a space between two; a part with neither runs on). The reference
is tiktoken over the whole text."""

from __future__ import annotations

import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.conversation.tokens import ENCODING_NAME, encode_long
from tests.fuzz._support import examples

REFERENCE = tiktoken.get_encoding(ENCODING_NAME)

SPECIAL = [" ", "  ", "\n", "\n\n", "\r\n", " \n", "\t", "'s", "'LL", "123456", "a", "Zürich"]
SPECIAL += ["東京", "🙂", "e\u0301", "_", "\u00a0", "٣٤", "x = f(1, 2)", "!!", "<|endoftext|>"]
fragments = st.one_of(
    st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12),
    st.sampled_from(SPECIAL),
)
texts = st.lists(fragments, max_size=60).map("".join)


@settings(max_examples=examples(ci=2.0, deep=1.0))
@given(text=texts, chunk=st.integers(1, 64))
def test_cut_text_encodes_as_the_whole(text: str, chunk: int) -> None:
    assert encode_long(text, chunk).tolist() == REFERENCE.encode_ordinary(text)
