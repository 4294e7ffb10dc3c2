"""The simulator's tool arguments are valid for the tool's JSON Schema (SIM-7).

A hypothesis property draws random satisfiable schemas (nested objects and arrays, bounds,
``multipleOf``, enums, ``const``, nullable types, ``anyOf``, ``$ref`` into ``$defs``,
``additionalProperties: false``) with parameter names the plausibility heuristic reacts to, and
validates the generated arguments with ``jsonschema``.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
from hypothesis import given
from hypothesis import strategies as st

from engine.models.sim.schema_args import arguments_for

NAMES = ["cmd", "command", "path", "workdir", "timeout_ms", "max_tokens", "count", "city", "q"]


def integers() -> st.SearchStrategy[dict[str, Any]]:
    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "integer"}
        step = draw(st.sampled_from([None, 2, 5, 7]))
        low = draw(st.none() | st.integers(-50, 5000))
        if low is not None:
            schema["exclusiveMinimum" if draw(st.booleans()) else "minimum"] = low
        if draw(st.booleans()):
            top = (low if low is not None else 0) + draw(st.integers(2, 40)) + (step or 0)
            schema["exclusiveMaximum" if draw(st.booleans()) else "maximum"] = top
        if step:
            schema["multipleOf"] = step
        return schema

    return build()


def numbers() -> st.SearchStrategy[dict[str, Any]]:
    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "number"}
        low = draw(st.none() | st.floats(-100, 100, allow_nan=False).map(lambda x: round(x, 2)))
        if low is not None:
            schema["exclusiveMinimum" if draw(st.booleans()) else "minimum"] = low
        if draw(st.booleans()):
            width = draw(st.floats(0.05, 50)) if low is not None else draw(st.floats(-50, 50))
            schema["maximum"] = round((low or 0) + width, 2) if low is not None else round(width, 2)
            if low is not None and schema["maximum"] <= low:
                schema["maximum"] = low + 1
        return schema

    return build()


def strings() -> st.SearchStrategy[dict[str, Any]]:
    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "string"}
        low = draw(st.none() | st.integers(0, 6))
        if low is not None:
            schema["minLength"] = low
        if draw(st.booleans()):
            schema["maxLength"] = (low or 0) + draw(st.integers(0, 4))
        return schema

    return build()


LEAVES = st.one_of(
    integers(),
    numbers(),
    strings(),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.just({"type": ["integer", "null"]}),
    st.lists(st.sampled_from(["a", "b", 3, None]), min_size=1, unique=True).map(
        lambda e: {"enum": e}
    ),
    st.sampled_from([{"const": "fixed"}, {"const": 4}]),
    st.just({}),
)


def composites(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    @st.composite
    def objects(draw: st.DrawFn) -> dict[str, Any]:
        props = draw(st.dictionaries(st.sampled_from(NAMES), children, max_size=4))
        schema: dict[str, Any] = {"type": "object", "properties": props}
        if draw(st.booleans()):
            schema["required"] = [n for n in props if draw(st.booleans())]
        if draw(st.booleans()):
            schema["additionalProperties"] = False
        return schema

    @st.composite
    def arrays(draw: st.DrawFn) -> dict[str, Any]:
        low = draw(st.integers(0, 3))
        schema: dict[str, Any] = {"type": "array", "items": draw(children), "minItems": low}
        if draw(st.booleans()):
            schema["maxItems"] = low + draw(st.integers(0, 2))
        return schema

    any_of = st.lists(children, min_size=1, max_size=3).map(lambda options: {"anyOf": options})
    nullable = children.map(lambda c: {"anyOf": [{"type": "null"}, c]})
    return st.one_of(objects(), arrays(), any_of, nullable)


SCHEMAS = st.recursive(LEAVES, composites, max_leaves=12)


@st.composite
def tool_parameters(draw: st.DrawFn) -> dict[str, Any]:
    """A function's ``parameters``: an object, sometimes reaching a shared ``$defs`` entry."""
    props = draw(st.dictionaries(st.sampled_from(NAMES), SCHEMAS, min_size=1, max_size=5))
    root: dict[str, Any] = {"type": "object", "properties": props}
    root["required"] = [n for n in props if draw(st.booleans())]
    root["additionalProperties"] = draw(st.booleans())
    if draw(st.booleans()):
        root["$defs"] = {"Shared": draw(SCHEMAS)}
        root["properties"]["shared"] = {"$ref": "#/$defs/Shared"}
        root["required"].append("shared")
    return root


@given(tool_parameters(), st.sampled_from(["Paris", "value"]))
def test_generated_arguments_validate_against_random_schemas(
    schema: dict[str, Any], hint: str
) -> None:
    """SIM-7: every generated argument object is valid for its schema."""
    arguments = arguments_for(schema, hint)
    jsonschema.Draft202012Validator(schema).validate(arguments)
    # What goes on the wire parses back to the same, valid value.
    jsonschema.Draft202012Validator(schema).validate(json.loads(json.dumps(arguments)))


@given(st.integers(-20, 20), st.integers(1, 60), st.sampled_from(["number", "integer"]))
def test_numbers_are_whole_without_a_fraction_when_the_bounds_allow(
    low: int, width: int, kind: str
) -> None:
    """SIM-7: a ``number`` a client may parse as an unsigned integer is written ``1``, not
    ``1.0``."""
    schema = {"type": "object", "properties": {"n": {"type": kind, "minimum": low}}}
    schema["properties"]["n"]["maximum"] = low + width
    text = json.dumps(arguments_for(schema, "x"))
    assert "." not in text


def test_values_are_plausible_by_parameter_name() -> None:
    """SIM-7: command-like → ``ls``; path-like → ``.``; milliseconds and budgets → 1000;
    only required properties are filled when ``required`` is given (Codex's exec_command)."""
    exec_command = {
        "type": "object",
        "properties": {
            "cmd": {"type": "string"},
            "justification": {"type": "string"},
            "max_output_tokens": {"type": "number"},
            "yield_time_ms": {"type": "number"},
        },
        "required": ["cmd"],
        "additionalProperties": False,
    }
    assert arguments_for(exec_command, "Paris") == {"cmd": "ls"}
    everything = {**exec_command, "required": list(exec_command["properties"])}
    assert arguments_for(everything, "Paris") == {
        "cmd": "ls",
        "justification": "Paris",
        "max_output_tokens": 1000,
        "yield_time_ms": 1000,
    }
    shell = {
        "type": "object",
        "properties": {
            "command": {"type": "array", "items": {"type": "string"}},
            "workdir": {"type": "string"},
            "timeout_ms": {"type": "integer", "maximum": 500},
        },
    }
    assert arguments_for(shell, "x") == {"command": ["ls"], "workdir": ".", "timeout_ms": 500}
