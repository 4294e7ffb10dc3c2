"""TOK-12: bpe-openai's cl100k gives tiktoken's ids on any text (special-token text stays
ordinary text), so the engine may use it, with tiktoken kept as the reference and fallback."""

from __future__ import annotations

import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st

from clients.bench.suites.codex import TOOL_NAMES, generated_output
from engine.conversation.tokens import ENCODING_NAME, encode, encoding

REFERENCE = tiktoken.get_encoding(ENCODING_NAME)
FAST = encoding()  # bpe-openai's, loaded the engine's way
NONE: frozenset[str] = frozenset()

pieces = st.one_of(
    st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40),
    st.sampled_from(["<|endoftext|>", "<|fim_prefix|>", " ", "\n\n", "\r\n", "'s", "123456"]),
    st.builds(generated_output, st.sampled_from(TOOL_NAMES), st.integers(0, 99), st.just(300)),
)
texts = st.lists(pieces, max_size=10).map("".join)


def ids(encoder: object, text: str) -> list[int]:
    array = encoder.encode_to_numpy(text, allowed_special=NONE, disallowed_special=())
    out: list[int] = array.tolist()
    return out


@settings(max_examples=300)
@given(text=texts)
def test_bpe_openai_matches_tiktoken(text: str) -> None:
    assert ids(FAST, text) == ids(REFERENCE, text)
    assert encode(text) == REFERENCE.encode_ordinary(text)


def test_the_engine_uses_bpe_openai_when_installed() -> None:
    assert type(FAST).__module__.startswith("bpe_openai")
