"""Semantic validation the schema cannot express (SPEC: VAL-1..VAL-6, ITEM-4, TOOL-5)."""

from __future__ import annotations

import re
from typing import cast

from engine.conversation.context import Context
from protocol.errors import InvalidRequest
from protocol.items import (
    CustomToolCall,
    CustomToolCallOutput,
    FunctionCall,
    FunctionCallOutput,
    InputFile,
    InputImage,
    InputItem,
    ItemReference,
    Message,
    OpaqueItem,
    ToolCall,
    ToolOutput,
)
from protocol.tools import (
    CustomTool,
    FunctionTool,
    NamespaceTool,
    ToolChoice,
    Toolset,
    forced_hosted,
)


def resolve_references(ctx: Context, items: list[InputItem], param: str) -> list[InputItem]:
    """Replace ``item_reference`` items by the items they name (ITEM-4)."""
    if ItemReference not in map(type, items):  # compared in C, no isinstance per item
        return items
    out: list[InputItem] = []
    local = {i.id: i for i in items if getattr(i, "id", None) and not isinstance(i, ItemReference)}
    for index, item in enumerate(items):
        if isinstance(item, ItemReference):
            found = ctx.by_id.get(item.id) or local.get(item.id)
            if found is None:
                raise InvalidRequest(
                    "item_not_found",
                    f"Item with id '{item.id}' not found in this conversation.",
                    f"{param}[{index}].id",
                )
            out.append(found)
        else:
            out.append(item)
    return out


def validate(
    ctx: Context, items: list[InputItem], supports: frozenset[str], param: str = "input"
) -> None:
    """Semantic checks the schema cannot express (VAL-1..VAL-5). Looks up the context's ledger
    in place and tracks only this batch, so the cost follows the new items, not the history."""
    calls: set[str] = set()  # introduced by this batch
    answered: set[str] = set()
    for index, item in enumerate(items):
        where = f"{param}[{index}]"
        # Exact types (no item type is subclassed): an ``isinstance`` that misses a Struct type
        # asks its metaclass, ~0.1 us, and ~0.6 us against a union.
        kind = type(item)
        if kind is FunctionCall or kind is CustomToolCall:
            calls.add(cast(ToolCall, item).call_id)
        elif kind is FunctionCallOutput or kind is CustomToolCallOutput:
            item = cast(ToolOutput, item)
            if item.call_id not in calls and item.call_id not in ctx.calls:
                raise InvalidRequest(
                    "unknown_call_id",
                    f"No tool call found for function call output with call_id '{item.call_id}'.",
                    f"{where}.call_id",
                )
            if item.call_id in answered or item.call_id in ctx.answered:
                raise InvalidRequest(
                    "duplicate_tool_output",
                    f"Duplicate function call output for call_id '{item.call_id}'.",
                    f"{where}.call_id",
                )
            answered.add(item.call_id)
            _check_content(item.output, supports, f"{where}.output")
        elif kind is Message:
            _check_content(cast(Message, item).content, supports, f"{where}.content")
        elif kind is OpaqueItem and cast(OpaqueItem, item).type == "mcp_approval_response":
            _check_approval(ctx, cast(OpaqueItem, item), calls, where)


def _check_approval(ctx: Context, item: OpaqueItem, calls: set[str], where: str) -> None:
    """An ``mcp_approval_response`` answers an approval request of the context or of an
    earlier item of the same input (MCP-18)."""
    request = item.data.get("approval_request_id")
    if not isinstance(request, str) or (request not in calls and request not in ctx.calls):
        raise InvalidRequest(
            "invalid_value",
            f"No MCP approval request found with id '{request}'.",
            f"{where}.approval_request_id",
        )


def _check_content(content: object, supports: frozenset[str], where: str) -> None:
    if isinstance(content, str):
        return
    assert isinstance(content, list)
    for index, part in enumerate(content):
        kind = (
            "image"
            if isinstance(part, InputImage)
            else "file"
            if isinstance(part, InputFile)
            else "text"
        )
        if kind not in supports:
            raise InvalidRequest(
                "unsupported_content",
                f"The selected model does not accept {kind} input.",
                f"{where}[{index}].type",
            )


_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_SCHEMA_TYPES = frozenset({"object", "string", "number", "integer", "boolean", "array", "null"})
MAX_SCHEMA_DEPTH = 32


def validate_tools(tools: Toolset) -> None:
    """Callable tool definitions are well formed (VAL-6, TOOL-2): valid names, unique within
    their namespace, JSON Schema objects. Hosted tools are the upstream's to check (TOOL-4)."""
    seen: set[tuple[str | None, str]] = set()
    for index, spec in enumerate(tools.specs):
        where = f"tools[{index}]"
        if isinstance(spec, NamespaceTool):
            _check_name(spec.name, None, seen, where)
            for inner, tool in enumerate(spec.tools):
                _check_callable(tool, spec.name, seen, f"{where}.tools[{inner}]")
        elif isinstance(spec, FunctionTool | CustomTool):
            _check_callable(spec, None, seen, where)


def _check_callable(
    tool: FunctionTool | CustomTool,
    namespace: str | None,
    seen: set[tuple[str | None, str]],
    where: str,
) -> None:
    _check_name(tool.name, namespace, seen, where)
    if isinstance(tool, FunctionTool) and tool.parameters is not None:
        if tool.parameters.get("type", "object") != "object":
            raise InvalidRequest(
                "invalid_value",
                "Function parameters must be a JSON Schema of type 'object'.",
                f"{where}.parameters.type",
            )
        check_schema(tool.parameters, f"{where}.parameters", 0)


def _check_name(
    name: str, namespace: str | None, seen: set[tuple[str | None, str]], where: str
) -> None:
    if not _TOOL_NAME.fullmatch(name):
        raise InvalidRequest(
            "invalid_value",
            "Tool names must be 1-64 characters of letters, digits, '_' or '-'.",
            f"{where}.name",
        )
    if (namespace, name) in seen:
        raise InvalidRequest(
            "duplicate_tool_name", f"Duplicate tool name '{name}'.", f"{where}.name"
        )
    seen.add((namespace, name))


def validate_tool_choice(tools: Toolset, choice: ToolChoice, runs_hosted: bool) -> None:
    """A ``tool_choice`` that forces a hosted tool needs a backend that runs hosted tools
    (TOOL-5)."""
    hosted = forced_hosted(choice)
    if hosted is not None and not runs_hosted:
        raise InvalidRequest(
            "unsupported_tool_choice",
            f"The selected model cannot run the hosted tool '{hosted}'; "
            "only a Responses upstream can.",
            "tool_choice.type",
        )


def check_schema(schema: object, where: str, depth: int) -> None:
    """Every ``type`` in a JSON Schema names a JSON type; nested schemas are checked too."""
    if depth > MAX_SCHEMA_DEPTH:
        raise InvalidRequest("invalid_value", "The JSON Schema is nested too deeply.", where)
    if not isinstance(schema, dict):
        raise InvalidRequest("invalid_type", "A JSON Schema must be an object.", where)
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    for k in kinds:
        if k not in _SCHEMA_TYPES:
            shown = k if isinstance(k, str) else type(k).__name__
            raise InvalidRequest(
                "invalid_value", f"Unknown JSON Schema type '{shown[:40]}'.", f"{where}.type"
            )
    for key in ("properties", "$defs", "definitions"):
        children = schema.get(key)
        if isinstance(children, dict):
            for name, child in children.items():
                check_schema(child, f"{where}.{key}.{name}", depth + 1)
    for key in ("items", "additionalProperties", "not"):
        child = schema.get(key)
        if isinstance(child, dict):
            check_schema(child, f"{where}.{key}", depth + 1)
    for key in ("anyOf", "oneOf", "allOf"):
        options = schema.get(key)
        if isinstance(options, list):
            for n, child in enumerate(options):
                check_schema(child, f"{where}.{key}[{n}]", depth + 1)
