"""PARSE-1..PARSE-7, TOK-6: every tool parser gives the same items however the sampled text is
split into deltas, keeps what is not a call as text (counted, never a crash), and drops only
whitespace around calls. Each format's samples follow vLLM's parser of the same name."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from engine.models.base import ArgsDelta, CallEnd, CallStart, Delta, TextDelta
from engine.models.tokens.parsers.qwen3_coder import typed
from engine.models.tokens.tool_parsers import PARSERS

Items = list[tuple[str, str]]
SCHEMAS: dict[str, dict[str, Any]] = {
    "get_weather": {"type": "object", "properties": {"city": {"type": "string"}}},
    "add": {
        "type": "object",
        "properties": {
            "a": {"type": "integer"},
            "b": {"type": "number"},
            "exact": {"type": "boolean"},
            "tags": {"type": "array"},
            "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        },
    },
}


def run(parser_name: str, chunks: list[str]) -> tuple[Items, int]:
    """(kind, text) per output item (consecutive text deltas form one message), and how
    many calls were kept as text."""
    parser = PARSERS[parser_name](SCHEMAS)
    deltas: list[Delta] = [d for chunk in chunks for d in parser.feed(chunk)] + parser.finish()
    out: Items = []
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
    assert parser.calls == sum(1 for kind, _ in out if kind == "call")
    return out, parser.malformed


def weather(city: str = "Paris") -> tuple[str, str]:
    return ("call", f'get_weather {{"city": "{city}"}}')


HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
QWEN_CALL = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n"
    "</tool_call>"
)
QWEN_TYPED = (
    "<tool_call>\n<function=add>\n<parameter=a>\n12\n</parameter>\n<parameter=b>\n2.5\n"
    '</parameter>\n<parameter=exact>\nTrue\n</parameter>\n<parameter=tags>\n["x", 1]\n'
    "</parameter>\n<parameter=note>\nNone\n</parameter>\n<parameter=extra>\n7\n</parameter>\n"
    "</function>\n</tool_call>"
)
LLAMA_CALL = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
LLAMA_OPEN = '<|python_tag|>{"name": "get_weather"'
MISTRAL_OLD = '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]'
MISTRAL_NEW = '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'

# parser -> [(text, items, malformed)]
SAMPLES: dict[str, list[tuple[str, Items, int]]] = {
    "hermes": [
        ("Let me check.\n" + HERMES_CALL, [("text", "Let me check.\n"), weather()], 0),
        (HERMES_CALL + "\n" + HERMES_CALL, [weather(), weather()], 0),
        ("a < b and <tool_ca", [("text", "a < b and <tool_ca")], 0),
        ("<tool_call>not json</tool_call> ok", [("text", "<tool_call>not json</tool_call> ok")], 1),
        ('<tool_call>{"name": "f"', [("text", '<tool_call>{"name": "f"')], 1),
        ("  \n", [], 0),
    ],
    "qwen3_coder": [
        ("Sure.\n\n" + QWEN_CALL, [("text", "Sure.\n\n"), weather()], 0),
        (QWEN_CALL + "\n" + QWEN_CALL, [weather(), weather()], 0),
        (
            QWEN_TYPED,
            [
                (
                    "call",
                    'add {"a": 12, "b": 2.5, "exact": true, "tags": ["x", 1], '
                    '"note": null, "extra": "7"}',
                )
            ],
            0,
        ),
        (  # a missing </parameter>: the next parameter ends it, as in vLLM
            "<tool_call><function=get_weather><parameter=city>Rome</function></tool_call>",
            [weather("Rome")],
            0,
        ),
        ("<tool_call>no function</tool_call>", [("text", "<tool_call>no function</tool_call>")], 1),
        ("<tool_call><function=f>", [("text", "<tool_call><function=f>")], 1),
    ],
    "llama3_json": [
        (LLAMA_CALL, [weather()], 0),
        ("<|python_tag|>" + LLAMA_CALL + "; " + LLAMA_CALL, [weather(), weather()], 0),
        ("  \n" + LLAMA_CALL + "\nDone.", [weather(), ("text", "Done.")], 0),
        ("It is sunny {maybe}.", [("text", "It is sunny {maybe}.")], 0),
        ('{"city": "Paris"}', [("text", '{"city": "Paris"}')], 1),
        (LLAMA_OPEN, [("text", LLAMA_OPEN)], 1),
        ("<|python", [("text", "<|python")], 0),
    ],
    "mistral": [
        ("Checking." + MISTRAL_OLD, [("text", "Checking."), weather()], 0),
        (MISTRAL_NEW + MISTRAL_NEW.replace("Paris", "Rome"), [weather(), weather("Rome")], 0),
        ('[TOOL_CALLS]get_weather{"city": "Paris"}', [weather()], 0),
        ('[TOOL_CALLS]get_weather[CALL_ID]a1B2c3D4e[ARGS]{"city": "Paris"}', [weather()], 0),
        (
            '[TOOL_CALLS]not a name{"x": 1}' + MISTRAL_NEW,
            [("text", '[TOOL_CALLS]not a name{"x": 1}'), weather()],
            1,
        ),
        ("[TOOL_CALLS] [1, 2]", [("text", "[TOOL_CALLS] [1, 2]")], 1),
        ("[TOOL_CALLS]get_weather[ARGS]{", [("text", "[TOOL_CALLS]get_weather[ARGS]{")], 1),
        ("a [TOOL", [("text", "a [TOOL")], 0),
    ],
}
CASES = [(name, *sample) for name, samples in SAMPLES.items() for sample in samples]


def test_every_registered_parser_has_samples() -> None:
    assert set(SAMPLES) <= set(PARSERS)
    assert {"hermes", "qwen3_coder", "llama3_json", "mistral"} <= set(SAMPLES)


def test_samples() -> None:
    for name, text, expected, malformed in CASES:
        assert run(name, [text]) == (expected, malformed), (name, text)


def split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(c, len(text)) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


@given(st.sampled_from(CASES), st.lists(st.integers(0, 200), max_size=8))
def test_any_split_gives_the_same_items(case: tuple[str, str, Items, int], cuts: list[int]) -> None:
    name, text, expected, malformed = case
    assert run(name, split(text, cuts)) == (expected, malformed)


# Generated answers: runs of text, whitespace, calls and broken calls in each format.
FRAGMENTS: dict[str, list[str]] = {
    "hermes": [HERMES_CALL, "<tool_call>{bad}</tool_call>", "<tool_call", "</tool_call>"],
    "qwen3_coder": [QWEN_CALL, QWEN_TYPED, "<tool_call><function=x></tool_call>", "<parameter="],
    "llama3_json": [LLAMA_CALL, "; ", "<|python_tag|>", '{"name": 3}', "{", "}"],
    "mistral": [MISTRAL_OLD, MISTRAL_NEW, "[TOOL_CALLS]", "[ARGS]", "{", "]", "[TOOL_CALLS]x y{}"],
}
PLAIN = ["Hello", " ", "\n\n", "a < b", "{", "[", "ok.", "é東"]


@st.composite
def answers(draw: st.DrawFn) -> tuple[str, str]:
    name = draw(st.sampled_from(sorted(FRAGMENTS)))
    parts = draw(st.lists(st.sampled_from(FRAGMENTS[name] + PLAIN), max_size=8))
    return name, "".join(parts)


@given(answers(), st.lists(st.integers(0, 400), max_size=10))
def test_generated_answers_split_anywhere_give_the_same_items(
    answer: tuple[str, str], cuts: list[int]
) -> None:
    """Never a crash, and the split never matters."""
    name, text = answer
    assert run(name, split(text, cuts)) == run(name, [text])


def test_qwen3_coder_types_values_by_the_schema_as_vllm_does() -> None:
    assert typed("5", {"type": "integer"}) == 5
    assert typed("5", {"type": "string"}) == "5"
    assert typed("5.0", {"type": "number"}) == 5
    assert typed("inf", {"type": "number"}) == "inf"
    assert typed("x", {"type": "integer"}) == "x"
    assert typed("TRUE", {"type": "boolean"}) is True
    assert typed("null", {"type": "integer"}) is None
    assert typed("null", {"type": "string"}) == "null"
    assert typed("{1, 2}", {"type": "object"}) == "{1, 2}"  # a set has no JSON form
    assert typed('{"k": [1]}', {"type": "object"}) == {"k": [1]}
    assert typed("7", {"type": ["integer", "null"]}) == 7
    assert typed("7", None) == "7"
    json.dumps(typed("[1, (2, 3)]", {"type": "array"}))


def test_regression_a_marker_split_right_after_a_malformed_mistral_call() -> None:
    """Found by the split property: a malformed call given up on while the next
    ``[TOOL_CALLS]`` had only begun to arrive swallowed that marker as text."""
    text = '[TOOL_CALLS]not a name{"x": 1}' + MISTRAL_NEW
    expected = ([("text", '[TOOL_CALLS]not a name{"x": 1}'), weather()], 1)
    assert run("mistral", [text[:31], text[31:]]) == expected


def test_regression_two_mistral_markers_in_a_row() -> None:
    """Found by the generated-answers property: text held after the last call replaced the
    deltas flushed at the end, losing a call the parser had counted."""
    text = '[TOOL_CALLS][TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]['
    assert run("mistral", [text]) == ([("text", "[TOOL_CALLS]"), weather(), ("text", "[")], 1)


def test_a_route_names_its_parser_and_an_unknown_one_is_a_clear_config_error() -> None:
    import pytest

    from engine.models.config import ConfigError, parse_config

    route = {"backend": "tokens", "api": "sglang", "base_url": "http://x", "tokenizer": "t"}
    for name in ("hermes", "qwen3_coder", "llama3_json", "mistral"):
        config = parse_config({"models": {"m": {**route, "tool_parser": name}}})
        assert config.models["m"].tool_parser == name
    with pytest.raises(ConfigError) as caught:
        parse_config({"models": {"m": {**route, "tool_parser": "nope"}}})
    assert str(caught.value) == (
        "config: models.m.tool_parser: unknown tool parser; known: "
        "hermes, llama3_json, mistral, qwen3_coder"
    )
    with pytest.raises(ConfigError, match=r"models\.m\.sglang_stream"):
        parse_config({"models": {"m": {**route, "sglang_stream": "sometimes"}}})
