"""HARMONY-7: the harmony renderer's ``render`` of a message (its frame around bpe-openai's
o200k ids of the text) is exactly ``encoding.render`` of it, for every kind of message the items
become and any text, special-token text, long text and non-UTF-8 text included."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai_harmony import HarmonyError

from engine.conversation.tokens import CHUNK_CHARS
from engine.models.tokens.harmony import HarmonyRenderer, harmony_encoding, harmony_messages
from protocol.items import (
    FunctionCall,
    FunctionCallOutput,
    InputItem,
    Message,
    Reasoning,
    ReasoningText,
)


def _items(text: str) -> list[InputItem]:
    """One of each kind of item that renders with a text (HARMONY-2)."""
    return [
        Message(role="user", content=text),
        Message(role="developer", content=text),
        Message(role="assistant", content=text),
        Reasoning(id="rs_1", summary=[], content=[ReasoningText(text)]),
        FunctionCall(call_id="c1", name="exec_command", arguments=text),
        FunctionCallOutput(call_id="c1", output=text),
        FunctionCallOutput(call_id="c2", output=text),  # a call the items do not name
    ]


@pytest.fixture(scope="module")
def renderer() -> HarmonyRenderer:
    return HarmonyRenderer(harmony_encoding())


def _assert_exact(renderer: HarmonyRenderer, text: str) -> None:
    items = _items(text)
    names = {"c1": "exec_command"}
    for message in harmony_messages(items, names, Counter()):
        assert renderer.render(message) == renderer.encoding.render(message), message


pieces = st.one_of(
    st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=30),
    st.sampled_from(
        ["<|end|>", "<|message|>", "<|call|>", "<|start|>", " ", "\n\n", "  \t", "'s", "Zürich"]
    ),
)


@settings(max_examples=150, deadline=None)
@given(text=st.lists(pieces, max_size=12).map("".join))
def test_render_is_harmonys_for_any_text(renderer: HarmonyRenderer, text: str) -> None:
    """HARMONY-7"""
    _assert_exact(renderer, text)


@pytest.mark.parametrize("size", [1, CHUNK_CHARS, CHUNK_CHARS + 1])
def test_render_is_harmonys_for_long_text(renderer: HarmonyRenderer, size: int) -> None:
    """HARMONY-7: a text over the chunk size is harmony's own render."""
    _assert_exact(renderer, ("fn main() { x = 1; } Zürich " * (size // 27 + 1))[:size])


def test_fast_path_is_taken(renderer: HarmonyRenderer) -> None:
    """HARMONY-7: the frame is kept per header and bpe-openai encodes the text."""
    assert renderer._fast is not None
    _assert_exact(renderer, "a tool's output\n" * 40)
    assert renderer._frames


def test_lone_surrogate_is_refused_as_before(renderer: HarmonyRenderer) -> None:
    """HARMONY-7: a text with no UTF-8 goes to harmony, which refuses it as it always did."""
    broken = FunctionCallOutput(call_id="c", output="a\ud800b")
    (message,) = harmony_messages([broken], {}, Counter())
    with pytest.raises((HarmonyError, UnicodeEncodeError, ValueError)) as theirs:
        renderer.encoding.render(message)
    with pytest.raises(theirs.type):
        renderer.render(message)
