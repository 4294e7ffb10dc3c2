"""The tool registry: definitions, schema derivation, execution that never raises."""

from __future__ import annotations

import asyncio
import threading
from typing import Literal

import msgspec
import pytest

from clients.loop import Hooks, run_tools
from clients.toolbox import ToolError, ToolRegistry, json_type
from protocol.items import FunctionCall
from protocol.response import FunctionTool


def make_registry() -> ToolRegistry:
    registry = ToolRegistry()

    @registry.tool
    def add(a: int, b: int = 2) -> int:
        """Add two integers.

        Longer explanation that is not part of the description."""
        return a + b

    @registry.tool(name="shout", description="Upper-case a text.")
    async def _shout(text: str, times: int | None = None) -> str:
        await asyncio.sleep(0)
        return text.upper() * (times or 1)

    @registry.tool
    def fail(reason: str) -> str:
        raise ValueError(reason)

    @registry.tool
    def refuse() -> str:
        raise ToolError("no such thing")

    @registry.tool
    def nothing() -> None:
        return None

    @registry.tool
    def pair(x: str) -> dict[str, object]:
        return {"x": x, "n": [1, 2]}

    return registry


def test_schema_derived_from_signature_and_docstring() -> None:
    add = make_registry().definitions()[0]
    assert add == {
        "type": "function",
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a"],
            "additionalProperties": False,
        },
    }


def test_decorator_arguments_and_explicit_schema() -> None:
    registry = make_registry()
    shout = registry.get("shout")
    assert shout is not None and shout.description == "Upper-case a text."
    assert shout.parameters["properties"] == {
        "text": {"type": "string"},
        "times": {"type": "integer"},
    }
    schema = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    tool = registry.register("find", lambda q: q, "Find.", schema)
    assert tool.definition()["parameters"] is schema
    assert registry.names[-1] == "find" and "find" in registry and len(registry) == 7


def test_definitions_are_valid_function_tools() -> None:
    tools = msgspec.convert(make_registry().definitions(), list[FunctionTool])
    assert [t.name for t in tools] == ["add", "shout", "fail", "refuse", "nothing", "pair"]


def test_json_type_covers_common_annotations() -> None:
    assert json_type(list[str]) == {"type": "array", "items": {"type": "string"}}
    assert json_type(Literal["a", "b"]) == {"enum": ["a", "b"]}
    assert json_type(float | None) == {"type": "number"}
    assert json_type(int | str) == {"anyOf": [{"type": "integer"}, {"type": "string"}]}
    assert json_type(bool) == {"type": "boolean"}
    assert json_type(object) == {}


def test_duplicate_names_are_rejected() -> None:
    registry = make_registry()
    with pytest.raises(ValueError, match="already registered"):
        registry.register("add", lambda: 0)


@pytest.mark.parametrize(
    ("name", "arguments", "output", "ok"),
    [
        ("add", '{"a": 1}', "3", True),
        ("add", {"a": 1, "b": 5}, "6", True),
        ("shout", '{"text": "hi", "times": 2}', "HIHI", True),
        ("pair", '{"x": "é"}', '{"x": "é", "n": [1, 2]}', True),
        ("nothing", "", "(no output)", True),
        ("fail", '{"reason": "boom"}', "error: ValueError: boom", False),
        ("refuse", "{}", "no such thing", False),
    ],
)
async def test_execute_sync_and_async(
    name: str, arguments: str | dict[str, object], output: str, ok: bool
) -> None:
    outcome = await make_registry().execute(name, arguments)
    assert (outcome.output, outcome.ok) == (output, ok)


@pytest.mark.parametrize(
    ("name", "arguments", "fragment"),
    [
        ("missing", "{}", "unknown tool 'missing'"),
        ("add", "{not json", "not valid JSON"),
        ("add", "[1, 2]", "must be a JSON object"),
        ("add", "{}", "missing a required argument: 'a'"),
        ("add", '{"a": 1, "zzz": 2}', "unexpected keyword argument 'zzz'"),
    ],
)
async def test_bad_calls_become_error_outputs(name: str, arguments: str, fragment: str) -> None:
    outcome = await make_registry().execute(name, arguments)
    assert not outcome.ok
    assert fragment in outcome.output
    assert outcome.output.startswith("error:")


async def test_blocking_tool_runs_in_a_worker_thread() -> None:
    registry = ToolRegistry()
    registry.register("where", lambda: threading.get_ident(), blocking=True)
    outcome = await registry.execute("where", "{}")
    assert outcome.ok and int(outcome.output) != threading.get_ident()


async def test_calls_of_one_turn_run_concurrently_in_order() -> None:
    """Both tools wait on a two-party barrier: sequential execution would never finish."""
    registry = ToolRegistry()
    barrier = asyncio.Barrier(2)

    @registry.tool
    async def meet(tag: str) -> str:
        await barrier.wait()
        return tag

    calls = [
        FunctionCall(call_id=f"c{i}", name="meet", arguments=f'{{"tag": "t{i}"}}') for i in (1, 2)
    ]
    seen: list[str] = []
    hooks = Hooks(on_tool_call=lambda c: seen.append(c.call_id))
    async with asyncio.timeout(5):
        records = await run_tools(registry, calls, hooks)
    assert [(r.call_id, r.output) for r in records] == [("c1", "t1"), ("c2", "t2")]
    assert seen == ["c1", "c2"]
