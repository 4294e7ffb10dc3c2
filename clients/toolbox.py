"""A small tool registry: function tool definitions for requests, and safe execution of calls.

The rollout loop must never die because a tool misbehaved: every failure (unknown tool, bad JSON
arguments, wrong argument names, an exception inside the tool) becomes an error *string* handed
back to the model as the call's output, which is what an agent harness should do.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, overload

F = TypeVar("F", bound=Callable[..., Any])
Schema = dict[str, Any]

_JSON_TYPES: dict[type, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    list: "array",
    tuple: "array",
    dict: "object",
}


class ToolError(Exception):
    """An expected tool failure: its message becomes the output verbatim (no exception name)."""


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """What a call produced: the output string sent back, and whether the tool succeeded."""

    output: str
    ok: bool


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    fn: Callable[..., Any]
    description: str
    parameters: Schema
    blocking: bool = False

    def definition(self) -> dict[str, Any]:
        """The Responses API function tool JSON for this tool."""
        return {
            "type": "function",
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters,
        }


class ToolRegistry:
    """Named tools, their request definitions, and a never-raising ``execute``."""

    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}

    # ------------------------------------------------------------------ registration
    def register(
        self,
        name: str,
        fn: Callable[..., Any],
        description: str | None = None,
        parameters: Schema | None = None,
        *,
        blocking: bool = False,
    ) -> Tool:
        """Add a tool. Without ``parameters`` the JSON schema is derived from the signature;
        ``blocking=True`` runs a sync function in a worker thread instead of on the loop."""
        if name in self._tools:
            raise ValueError(f"tool {name!r} is already registered")
        tool = Tool(
            name=name,
            fn=fn,
            description=description if description is not None else _doc_summary(fn),
            parameters=parameters if parameters is not None else schema_from_signature(fn),
            blocking=blocking,
        )
        self._tools[name] = tool
        return tool

    @overload
    def tool(self, fn: F, /) -> F: ...

    @overload
    def tool(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        description: str | None = None,
        parameters: Schema | None = None,
        blocking: bool = False,
    ) -> Callable[[F], F]: ...

    def tool(
        self,
        fn: F | None = None,
        /,
        *,
        name: str | None = None,
        description: str | None = None,
        parameters: Schema | None = None,
        blocking: bool = False,
    ) -> F | Callable[[F], F]:
        """Decorator: ``@registry.tool`` or ``@registry.tool(name=..., description=...)``."""

        def decorate(func: F) -> F:
            self.register(name or func.__name__, func, description, parameters, blocking=blocking)
            return func

        return decorate(fn) if fn is not None else decorate

    # ------------------------------------------------------------------ views
    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def definitions(self) -> list[dict[str, Any]]:
        """The ``tools`` list for a ``response.create`` / ``POST /v1/responses`` body."""
        return [tool.definition() for tool in self._tools.values()]

    # ------------------------------------------------------------------ execution
    async def execute(self, name: str, arguments: str | Mapping[str, Any]) -> ToolOutcome:
        """Run one call. Never raises (except cancellation): failures become error outputs."""
        tool = self._tools.get(name)
        if tool is None:
            known = ", ".join(self._tools) or "none"
            return ToolOutcome(f"error: unknown tool '{name}' (available: {known})", False)
        try:
            kwargs = _decode_arguments(arguments)
            inspect.signature(tool.fn).bind(**kwargs)
        except (ValueError, TypeError) as exc:
            return ToolOutcome(f"error: invalid arguments for {name}: {exc}", False)
        try:
            value = await _call(tool, kwargs)
        except ToolError as exc:
            return ToolOutcome(str(exc), False)
        except Exception as exc:
            return ToolOutcome(f"error: {type(exc).__name__}: {exc}", False)
        return ToolOutcome(format_output(value), True)


async def _call(tool: Tool, kwargs: dict[str, Any]) -> Any:
    if tool.blocking:
        value = await asyncio.to_thread(tool.fn, **kwargs)
    else:
        value = tool.fn(**kwargs)
    if inspect.isawaitable(value):
        value = await value
    return value


def _decode_arguments(arguments: str | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(arguments, Mapping):
        return dict(arguments)
    try:
        decoded = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError as exc:
        raise ValueError(f"arguments are not valid JSON ({exc.msg})") from None
    if not isinstance(decoded, dict):
        raise ValueError("arguments must be a JSON object")
    return decoded


def format_output(value: Any) -> str:
    """Tool return value -> output string: strings as-is, anything else as JSON."""
    if isinstance(value, str):
        return value
    if value is None:
        return "(no output)"
    return json.dumps(value, ensure_ascii=False, default=str)


# ---------------------------------------------------------------------- schema derivation


def schema_from_signature(fn: Callable[..., Any]) -> Schema:
    """A JSON schema for ``fn``'s keyword arguments, from its annotations and defaults."""
    hints = typing.get_type_hints(fn)
    properties: dict[str, Schema] = {}
    required: list[str] = []
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            continue
        properties[param.name] = json_type(hints.get(param.name, Any))
        if param.default is param.empty:
            required.append(param.name)
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


def json_type(annotation: Any) -> Schema:
    """The JSON schema of one Python annotation (the common cases; anything else is ``{}``)."""
    origin = typing.get_origin(annotation)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if origin in (typing.Union, types.UnionType):
        return json_type(args[0]) if len(args) == 1 else {"anyOf": [json_type(a) for a in args]}
    if origin is typing.Literal:
        return {"enum": list(typing.get_args(annotation))}
    if origin in (list, tuple) and args:
        return {"type": "array", "items": json_type(args[0])}
    kind = _JSON_TYPES.get(origin or annotation)
    return {"type": kind} if kind else {}


def _doc_summary(fn: Callable[..., Any]) -> str:
    doc = inspect.getdoc(fn) or ""
    return doc.split("\n\n", 1)[0].replace("\n", " ").strip()
