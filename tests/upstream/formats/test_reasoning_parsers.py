"""REASON-1, REASON-3, HARMONY-3, HARMONY-4: the ``think`` parser and the harmony reader give the
same items (and the same reasoning-token count) however the sampled ids are split into chunks;
what does not parse stays text and is counted, never an exception."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tokenizers import Tokenizer

from engine.models.base import ArgsDelta, CallEnd, CallStart, Delta, ReasoningDelta, TextDelta
from engine.models.tokens.harmony import HarmonyReader, harmony_encoding
from engine.models.tokens.parsers.hermes import HermesParser
from engine.models.tokens.reasoning import AnswerReader, TextReader
from engine.models.tokens.think import ThinkParser
from engine.models.tokens.tokenizer import IncrementalDecoder

Item = tuple[str, str]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
WEATHER = ("call", 'get_weather {"city": "Paris"}')


def items(deltas: list[Delta]) -> list[Item]:
    """(kind, text) per output item: consecutive text (or reasoning) deltas form one item."""
    out: list[Item] = []
    for delta in deltas:
        if isinstance(delta, TextDelta | ReasoningDelta):
            kind = "text" if isinstance(delta, TextDelta) else "reasoning"
            if out and out[-1][0] == kind:
                out[-1] = (kind, out[-1][1] + delta.text)
            else:
                out.append((kind, delta.text))
        elif isinstance(delta, CallStart):
            out.append(("call", delta.name))
        elif isinstance(delta, ArgsDelta):
            out[-1] = ("call", out[-1][1] + " " + delta.text)
        else:
            assert isinstance(delta, CallEnd)
    return out


def split(seq: list[int], cuts: list[int]) -> list[list[int]]:
    points = sorted({min(c, len(seq)) for c in cuts})
    return [seq[a:b] for a, b in zip([0, *points], [*points, len(seq)], strict=True)]


def read(reader: AnswerReader, chunks: list[list[int]]) -> list[Item]:
    deltas = [d for chunk in chunks for d in reader.feed(chunk)] + reader.finish()
    return items(deltas)


# ----------------------------------------------------------------------------- think

THINK: list[tuple[str, bool, list[Item], int]] = [  # text, opened by template, items, unclosed
    (
        "<think>\nThe user wants weather.\n\n</think>\n\nIt is sunny.",
        False,
        [("reasoning", "The user wants weather."), ("text", "It is sunny.")],
        0,
    ),
    (
        "<think>\nNeed a tool.\n</think>\n\n" + CALL,
        False,
        [("reasoning", "Need a tool."), WEATHER],
        0,
    ),
    (
        "Thinking first.\n</think>\n\nDone.",
        True,
        [("reasoning", "Thinking first."), ("text", "Done.")],
        0,
    ),
    ("  <think>a\n\nb</think>x", False, [("reasoning", "a\n\nb"), ("text", "x")], 0),
    ("<think>\n\n</think>\n\nNo thoughts.", False, [("text", "No thoughts.")], 0),
    ("No thinking. <think>x</think>", False, [("text", "No thinking. <think>x</think>")], 0),
    ("<thinking>is text</thinking>", False, [("text", "<thinking>is text</thinking>")], 0),
    ("<think>\ncut off at a < b </thi", False, [("reasoning", "cut off at a < b </thi")], 1),
    ("<thi", False, [("text", "<thi")], 0),
    ("  \n", False, [], 0),
]


def think_items(text: str, opened: bool, cuts: list[int]) -> tuple[list[Item], Counter[str]]:
    stats: Counter[str] = Counter()
    parser = ThinkParser(HermesParser(), opened, stats)
    chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    deltas = [d for chunk in chunks for d in parser.feed(chunk)] + parser.finish()
    return items(deltas), stats


def test_think_samples() -> None:
    for text, opened, expected, unclosed in THINK:
        found, stats = think_items(text, opened, [])
        assert found == expected, text
        assert stats["reasoning.unclosed"] == unclosed, text


@given(st.sampled_from(THINK), st.lists(st.integers(0, 120), max_size=8))
def test_think_any_text_split_gives_the_same_items(
    sample: tuple[str, bool, list[Item], int], cuts: list[int]
) -> None:
    text, opened, expected, _ = sample
    points = sorted({min(c, len(text)) for c in cuts})
    assert think_items(text, opened, points)[0] == expected


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))


def think_reader(tokenizer: Tokenizer, opened: bool = False) -> TextReader:
    parser = ThinkParser(HermesParser(), opened, Counter())
    return TextReader(IncrementalDecoder(tokenizer, frozenset()), parser)


@given(data=st.data())
def test_think_any_id_split_gives_the_same_items_and_count(
    tokenizer: Tokenizer, data: st.DataObject
) -> None:
    """Over the sampled ids, chunked as a server streams them: the same items, and the same
    reasoning-token count, for every split."""
    text, opened, expected, _ = data.draw(st.sampled_from(THINK))
    ids: list[int] = tokenizer.encode(text, add_special_tokens=False).ids
    whole = think_reader(tokenizer, opened)
    assert read(whole, [ids]) == expected
    cuts = data.draw(st.lists(st.integers(0, len(ids)), max_size=8))
    chunked = think_reader(tokenizer, opened)
    assert read(chunked, split(ids, cuts)) == expected
    assert chunked.reasoning_tokens == whole.reasoning_tokens


def test_think_counts_the_reasoning_ids(tokenizer: Tokenizer) -> None:
    """From the id that completes ``<think>`` to the one that completes ``</think>``."""
    text = "<think>\nThe user wants weather.\n</think>\n\nIt is sunny."
    ids: list[int] = tokenizer.encode(text, add_special_tokens=False).ids
    prefixes = [tokenizer.decode(ids[: n + 1]) for n in range(len(ids))]
    opened = next(n for n, p in enumerate(prefixes) if "<think>" in p)
    closed = next(n for n, p in enumerate(prefixes) if "</think>" in p)
    reader = think_reader(tokenizer)
    read(reader, [ids])
    assert reader.reasoning_tokens == closed - opened + 1


# ----------------------------------------------------------------------------- harmony

H_CALL = (
    "<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "Paris"}<|call|>'
)
HARMONY: list[tuple[str, list[Item], str | None]] = [  # completion, items, counter expected
    (
        "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant" + H_CALL,
        [("reasoning", "Need the weather."), WEATHER],
        None,
    ),
    (
        "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant"
        "<|channel|>final<|message|>It is sunny in Paris.<|return|>",
        [("reasoning", "Easy."), ("text", "It is sunny in Paris.")],
        None,
    ),
    (
        "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant" + H_CALL,
        [("text", "Checking."), WEATHER],
        None,
    ),
    (
        "<|channel|>commentary to=functions.ping <|constrain|>json<|message|><|call|>",
        [("call", "ping {}")],
        None,
    ),
    ("hello<|return|>", [("text", "hello<|return|>")], "harmony.malformed"),
    (
        "<|channel|>analysis<|message|>x<|end|>oops, no start",
        [("reasoning", "x"), ("text", "oops, no start")],
        "harmony.malformed",
    ),
    (
        "<|channel|>commentary to=functions.f <|constrain|>json<|message|>not json<|call|>",
        [("text", "not json")],
        "harmony.malformed_call",
    ),
    (
        "<|channel|>commentary to=browser.search<|message|>{}<|call|>",
        [("text", "{}")],
        "harmony.unknown_recipient",
    ),
    ("<|channel|>bogus<|message|>hi<|end|>", [("text", "hi")], "harmony.unknown_channel"),
    ("<|channel|>final<|message|>Cut o", [("text", "Cut o")], None),
    (
        '<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"a": ',
        [("text", '{"a": ')],
        "harmony.malformed_call",
    ),
    ("<|channel|>analysis<|mess", [], "harmony.unfinished_header"),
]


def harmony_ids(text: str) -> list[int]:
    ids: list[int] = harmony_encoding().encode(text, allowed_special="all")
    return ids


def test_harmony_samples() -> None:
    for text, expected, counter in HARMONY:
        stats: Counter[str] = Counter()
        reader = HarmonyReader(harmony_encoding(), stats)
        assert read(reader, [harmony_ids(text)]) == expected, text
        assert set(stats) == ({counter} if counter else set()), text


def test_harmony_counts_analysis_ids() -> None:
    text = HARMONY[0][0]
    reader = HarmonyReader(harmony_encoding(), Counter())
    read(reader, [harmony_ids(text)])
    analysis = harmony_ids("<|message|>Need the weather.<|end|>")
    assert reader.reasoning_tokens == len(analysis)
    assert reader.calls == 1 and reader.ended_in_call


@given(data=st.data())
def test_harmony_any_id_split_gives_the_same_items(data: st.DataObject) -> None:
    text, expected, _ = data.draw(st.sampled_from(HARMONY))
    ids = harmony_ids(text)
    cuts = data.draw(st.lists(st.integers(0, len(ids)), max_size=8))
    whole = HarmonyReader(harmony_encoding(), Counter())
    chunked = HarmonyReader(harmony_encoding(), Counter())
    assert read(whole, [ids]) == expected
    assert read(chunked, split(ids, cuts)) == expected
    assert chunked.reasoning_tokens == whole.reasoning_tokens


@given(st.lists(st.integers(0, 201_087), max_size=40), st.lists(st.integers(0, 40), max_size=5))
def test_harmony_never_raises_on_any_ids(ids: list[int], cuts: list[int]) -> None:
    """Arbitrary sampled ids (special tokens included): items or text, never an exception."""
    reader = HarmonyReader(harmony_encoding(), Counter())
    read(reader, split(ids, cuts))
