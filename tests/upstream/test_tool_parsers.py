"""TOK-6: the hermes parser gives the same items however the sampled text is split into
deltas, keeps what is not a call as text, and drops only whitespace around calls."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from engine.models.base import ArgsDelta, CallEnd, CallStart, Delta, TextDelta
from engine.models.tokens.tool_parsers import HermesParser

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def items(chunks: list[str]) -> list[tuple[str, str]]:
    """(kind, text) per output item: consecutive text deltas form one message."""
    parser = HermesParser()
    deltas: list[Delta] = [d for chunk in chunks for d in parser.feed(chunk)] + parser.finish()
    out: list[tuple[str, str]] = []
    for delta in deltas:
        if isinstance(delta, TextDelta):
            if out and out[-1][0] == "text":
                out[-1] = ("text", out[-1][1] + delta.text)
            else:
                out.append(("text", delta.text))
        elif isinstance(delta, CallStart):
            out.append(("call", delta.name))
        elif isinstance(delta, ArgsDelta):
            out[-1] = ("call", out[-1][1] + " " + delta.text)
        else:
            assert isinstance(delta, CallEnd)
    return out


SAMPLES = [
    (
        "Let me check.\n" + CALL,
        [("text", "Let me check.\n"), ("call", 'get_weather {"city": "Paris"}')],
    ),
    (CALL + "\n" + CALL, [("call", 'get_weather {"city": "Paris"}')] * 2),
    ("a < b and <tool_ca", [("text", "a < b and <tool_ca")]),
    ("<tool_call>not json</tool_call> ok", [("text", "<tool_call>not json</tool_call> ok")]),
    ('<tool_call>{"name": "f"', [("text", '<tool_call>{"name": "f"')]),
    ("  \n", []),
]


def test_samples() -> None:
    for text, expected in SAMPLES:
        assert items([text]) == expected, text


@given(st.sampled_from(SAMPLES), st.lists(st.integers(0, 200), max_size=6))
def test_any_split_gives_the_same_items(
    sample: tuple[str, list[tuple[str, str]]], cuts: list[int]
) -> None:
    text, expected = sample
    points = sorted({min(c, len(text)) for c in cuts})
    chunks = [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]
    assert items(chunks) == expected
