"""TOK-50..TOK-52: a text of any size up to the request limit tokenizes exactly as the reference
encoder (tiktoken) does, though bpe-openai refuses 1,000,000 characters and 200,000 tokens.

The inputs are the ones that answered 500 before (issue 24): a 1.2 MB tool output of many lines,
a 600,000-character line over 200,000 tokens, a single word of 1,000,000 letters."""

from __future__ import annotations

import random

import pytest
import tiktoken

from engine.conversation.tokens import ENCODING_NAME, encode, encode_array, encoding

REFERENCE = tiktoken.get_encoding(ENCODING_NAME)
NONE: frozenset[str] = frozenset()


def _reference(text: str) -> list[int]:
    ids: list[int] = REFERENCE.encode_ordinary(text)
    return ids


def _tool_output(chars: int) -> str:
    """A file read whole: code-like lines, unicode, blank lines, numbers."""
    rng = random.Random(24)
    lines = [
        "def handler_{n}(request: Request) -> Response:  # Zürich 東京 🙂",
        "    return json.dumps({{'id': {n}, 'ok': True}}, indent=2)",
        "",
        "  \t# it's   spaced\tout  ",
        "{n}{n}{n} = [1, 2, 3]  …",
    ]
    out: list[str] = []
    size = 0
    while size < chars:
        line = rng.choice(lines).format(n=rng.randint(0, 10**6))
        out.append(line)
        size += len(line) + 1
    return "\n".join(out)[:chars]


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(_tool_output(1_200_000), id="1.2M-chars-of-lines"),
        pytest.param("a " * 300_000, id="one-line-of-300k-tokens"),
        pytest.param(
            "".join(random.Random(5).choice("abcdefghij") for _ in range(1_000_000)),
            id="a-1M-letter-word",
        ),
    ],
)
def test_long_texts_tokenize_exactly(text: str) -> None:
    fast = encoding()
    with pytest.raises(Exception, match=r"too long|token"):  # what answered 500 before
        fast.encode_to_numpy(text, allowed_special=NONE, disallowed_special=())
    ids = encode_array(text).tolist()
    assert ids == _reference(text)
    assert encode(text) == ids
