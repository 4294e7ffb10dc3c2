"""The second oracle: the Open Responses specification's required fields, as tables (CONF-3).

The openai SDK's models (the first oracle, ``tests/conftest.py``) are lenient where the Open
Responses OpenAPI document is strict: the SDK treats most Response fields as optional, the
document requires them (``presence_penalty``, ``frequency_penalty``, ``completed_at``,
``safety_identifier`` …). These tables restate, in our own words, what that document (version
2026-04-24) requires of the ``ResponseResource``, of every streaming event, of the WebSocket
error envelope, of the compacted response and of the output items and content parts they carry:
for each object, every required field and the JSON types its value may have. Fields the document
lists as optional are checked only for their type when present. Extra fields are allowed (the
document does not forbid them), so our extensions (``stream_id``, ``safety``, ``usage.estimated``)
pass.

Nothing here reads the document: a user who clones the project has only these tables.

``check_frame`` checks one decoded frame (any event, an HTTP JSON body, or a compacted response)
and returns the list of faults, each naming the JSON path at fault.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

# ----------------------------------------------------------------------------- JSON types

STR, INT, NUM, BOOL, ARR, OBJ, NULL, ANY = (
    "string",
    "integer",
    "number",
    "boolean",
    "array",
    "object",
    "null",
    "any",
)


def json_type_ok(value: Any, kind: str) -> bool:
    """JSON Schema's types for a decoded JSON value (a bool is not a number)."""
    if kind == ANY:
        return True
    if kind == NULL:
        return value is None
    if kind == BOOL:
        return isinstance(value, bool)
    if kind == INT:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == NUM:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == STR:
        return isinstance(value, str)
    if kind == ARR:
        return isinstance(value, list)
    return isinstance(value, dict)


@dataclass(frozen=True)
class Obj:
    """An object checked against a table; ``nullable`` allows null instead."""

    table: str
    nullable: bool = False


@dataclass(frozen=True)
class ArrayOf:
    """An array whose elements are checked against a union of tables picked by ``type``."""

    union: str


@dataclass(frozen=True)
class Tagged:
    """An object checked against the member of a ``type``-tagged union (null if nullable)."""

    union: str
    nullable: bool = False


@dataclass(frozen=True)
class OneOf:
    """A string from a fixed set (an enum), or null when ``nullable``."""

    values: tuple[str, ...]
    nullable: bool = False


Spec: TypeAlias = tuple[str, ...] | Obj | Tagged | ArrayOf | OneOf


@dataclass(frozen=True)
class Table:
    required: Mapping[str, Spec]
    optional: Mapping[str, Spec]


def _t(required: Mapping[str, Spec], optional: Mapping[str, Spec] | None = None) -> Table:
    return Table(required, optional or {})


# ----------------------------------------------------------------------------- the tables

ITEM_STATUS = OneOf(("in_progress", "completed", "incomplete"))

TABLES: dict[str, Table] = {
    # The Response object: every one of these 31 fields is required.
    "Response": _t(
        {
            "id": (STR,),
            "object": OneOf(("response",)),
            "created_at": (INT,),
            "completed_at": (INT, NULL),
            "status": (STR,),
            "incomplete_details": Obj("IncompleteDetails", nullable=True),
            "model": (STR,),
            "previous_response_id": (STR, NULL),
            "instructions": (STR, NULL),
            "output": ArrayOf("OutputItem"),
            "error": Obj("ResponseError", nullable=True),
            "tools": ArrayOf("Tool"),
            "tool_choice": (STR, OBJ),
            "truncation": OneOf(("auto", "disabled")),
            "parallel_tool_calls": (BOOL,),
            "text": Obj("TextField"),
            "top_p": (NUM,),
            "presence_penalty": (NUM,),
            "frequency_penalty": (NUM,),
            "top_logprobs": (INT,),
            "temperature": (NUM,),
            "reasoning": Obj("ReasoningConfig", nullable=True),
            "usage": Obj("Usage", nullable=True),
            "max_output_tokens": (INT, NULL),
            "max_tool_calls": (INT, NULL),
            "store": (BOOL,),
            "background": (BOOL,),
            "service_tier": (STR,),
            "metadata": (ANY,),
            "safety_identifier": (STR, NULL),
            "prompt_cache_key": (STR, NULL),
        }
    ),
    "IncompleteDetails": _t({"reason": (STR,)}),
    "ResponseError": _t({"code": (STR,), "message": (STR,)}),
    "TextField": _t({"format": Obj("TextFormat")}, {"verbosity": OneOf(("low", "medium", "high"))}),
    "TextFormat": _t({"type": OneOf(("text", "json_object", "json_schema"))}),
    "ReasoningConfig": _t({"effort": (STR, NULL), "summary": (STR, NULL)}),
    "Usage": _t(
        {
            "input_tokens": (INT,),
            "output_tokens": (INT,),
            "total_tokens": (INT,),
            "input_tokens_details": Obj("InputTokensDetails"),
            "output_tokens_details": Obj("OutputTokensDetails"),
        }
    ),
    "InputTokensDetails": _t({"cached_tokens": (INT,)}),
    "OutputTokensDetails": _t({"reasoning_tokens": (INT,)}),
    # Tools: the document defines only function tools (other types are the SDK oracle's).
    "Tool.function": _t(
        {
            "type": OneOf(("function",)),
            "name": (STR,),
            "description": (STR, NULL),
            "parameters": (OBJ, NULL),
            "strict": (BOOL, NULL),
        }
    ),
    # Output items (the document's ItemField union).
    "OutputItem.message": _t(
        {
            "type": OneOf(("message",)),
            "id": (STR,),
            "status": ITEM_STATUS,
            "role": OneOf(("user", "assistant", "system", "developer")),
            "content": ArrayOf("Part"),
        },
        {"phase": OneOf(("commentary", "final_answer"))},
    ),
    "OutputItem.function_call": _t(
        {
            "type": OneOf(("function_call",)),
            "id": (STR,),
            "call_id": (STR,),
            "name": (STR,),
            "arguments": (STR,),
            "status": ITEM_STATUS,
        }
    ),
    "OutputItem.function_call_output": _t(
        {
            "type": OneOf(("function_call_output",)),
            "id": (STR,),
            "call_id": (STR,),
            "output": (STR, ARR),
            "status": ITEM_STATUS,
        }
    ),
    "OutputItem.reasoning": _t(
        {"type": OneOf(("reasoning",)), "id": (STR,), "summary": ArrayOf("Part")},
        {"content": ArrayOf("Part"), "encrypted_content": (STR,)},
    ),
    "OutputItem.compaction": _t(
        {"type": OneOf(("compaction",)), "id": (STR,), "encrypted_content": (STR,)},
        {"created_by": (STR,)},
    ),
    # Content parts.
    "Part.input_text": _t({"type": (STR,), "text": (STR,)}),
    "Part.output_text": _t(
        {"type": (STR,), "text": (STR,), "annotations": (ARR,)}, {"logprobs": (ARR,)}
    ),
    "Part.text": _t({"type": (STR,), "text": (STR,)}),
    "Part.summary_text": _t({"type": (STR,), "text": (STR,)}),
    "Part.reasoning_text": _t({"type": (STR,), "text": (STR,)}),
    "Part.refusal": _t({"type": (STR,), "refusal": (STR,)}),
    "Part.input_image": _t({"type": (STR,), "image_url": (STR, NULL), "detail": (STR,)}),
    "Part.input_file": _t({"type": (STR,)}, {"filename": (STR,), "file_url": (STR,)}),
    "Part.input_video": _t({"type": (STR,), "video_url": (STR,)}),
    # Error payloads: the WebSocket envelope's (code a string) and the SSE event's (type and
    # param required). A payload we send satisfies both.
    "ErrorPayload": _t(
        {"type": (STR,), "code": (STR,), "message": (STR,), "param": (STR, NULL)},
        {"headers": (OBJ,)},
    ),
    # The compacted response of POST /v1/responses/compact.
    "Compaction": _t(
        {
            "id": (STR,),
            "object": OneOf(("response.compaction",)),
            "output": ArrayOf("OutputItem"),
            "created_at": (INT,),
            "usage": Obj("Usage"),
        }
    ),
}

# Every streaming event of the document: its fields besides ``type`` (always a string equal to
# the event's name) and ``sequence_number`` (always an integer).
_ITEM = {"item_id": (STR,), "output_index": (INT,)}
_CONTENT = {**_ITEM, "content_index": (INT,)}
_SUMMARY = {**_ITEM, "summary_index": (INT,)}
_PART = Tagged("Part")
_RESPONSE = {"response": Obj("Response")}
_OUTPUT_ITEM = {"output_index": (INT,), "item": Tagged("OutputItem", nullable=True)}
_OBFUSCATION = {"obfuscation": (STR,)}

EVENTS: dict[str, Table] = {
    "response.created": _t(_RESPONSE),
    "response.queued": _t(_RESPONSE),
    "response.in_progress": _t(_RESPONSE),
    "response.completed": _t(_RESPONSE),
    "response.failed": _t(_RESPONSE),
    "response.incomplete": _t(_RESPONSE),
    "response.output_item.added": _t(_OUTPUT_ITEM),
    "response.output_item.done": _t(_OUTPUT_ITEM),
    "response.reasoning_summary_part.added": _t({**_SUMMARY, "part": _PART}),
    "response.reasoning_summary_part.done": _t({**_SUMMARY, "part": _PART}),
    "response.content_part.added": _t({**_CONTENT, "part": _PART}),
    "response.content_part.done": _t({**_CONTENT, "part": _PART}),
    "response.output_text.delta": _t(
        {**_CONTENT, "delta": (STR,)}, {"logprobs": (ARR,), **_OBFUSCATION}
    ),
    "response.output_text.done": _t({**_CONTENT, "text": (STR,)}, {"logprobs": (ARR,)}),
    "response.refusal.delta": _t({**_CONTENT, "delta": (STR,)}),
    "response.refusal.done": _t({**_CONTENT, "refusal": (STR,)}),
    "response.reasoning.delta": _t({**_CONTENT, "delta": (STR,)}, _OBFUSCATION),
    "response.reasoning.done": _t({**_CONTENT, "text": (STR,)}),
    "response.reasoning_summary_text.delta": _t({**_SUMMARY, "delta": (STR,)}, _OBFUSCATION),
    "response.reasoning_summary_text.done": _t({**_SUMMARY, "text": (STR,)}),
    "response.output_text.annotation.added": _t(
        {**_CONTENT, "annotation_index": (INT,), "annotation": (OBJ, NULL)}
    ),
    "response.function_call_arguments.delta": _t({**_ITEM, "delta": (STR,)}, _OBFUSCATION),
    "response.function_call_arguments.done": _t({**_ITEM, "arguments": (STR,)}),
}

# The WebSocket error envelope (no sequence number; the document's WebSocketErrorEvent). The
# SSE ``error`` event would also need ``sequence_number``, but this server never writes one
# (HTTP-4): every error is a WebSocket envelope or an HTTP status with the same body.
WS_ERROR = _t({"status": (INT,), "error": Obj("ErrorPayload")})

# Events outside the document (SDK-only or our extensions, EV-2): the envelope rules this server
# promises, and any Response they carry is held to the document's Response table.
NON_DOCUMENT_EVENTS: dict[str, Table] = {
    "response.done": _t({**_RESPONSE, "pending_calls": (ARR,)}),
    "response.inject.created": _t({"response_id": (STR,)}),
    "response.inject.failed": _t({"response_id": (STR,), "error": (OBJ,), "input": (ARR,)}),
    "response.steer.failed": _t({"error": (OBJ,), "steer": (OBJ,)}),
    "response.steer.accepted": _t({"steer": (OBJ,)}),
    "response.steer.pending": _t({"reason": (STR,), "required_input": (ARR,), "steer": (OBJ,)}),
    # The SDK's events for custom (free-form) tool calls, which the document does not define.
    "response.custom_tool_call_input.delta": _t({**_ITEM, "delta": (STR,)}),
    "response.custom_tool_call_input.done": _t({**_ITEM, "input": (STR,)}),
    # The SDK's compaction progress event (COMPACT-7), which the document does not define.
    "response.compaction.compacting": _t(_ITEM),
    # The SDK's (and api.openai.com's) names for reasoning text events (REASON-2); the document
    # calls them response.reasoning.delta/.done with the same fields.
    "response.reasoning_text.delta": _t({**_CONTENT, "delta": (STR,)}, _OBFUSCATION),
    "response.reasoning_text.done": _t({**_CONTENT, "text": (STR,)}),
    # The SDK's remote MCP events (SPEC §18, MCP-5, MCP-7), which the document does not define.
    "response.mcp_list_tools.in_progress": _t(_ITEM),
    "response.mcp_list_tools.completed": _t(_ITEM),
    "response.mcp_list_tools.failed": _t(_ITEM),
    "response.mcp_call.in_progress": _t(_ITEM),
    "response.mcp_call.completed": _t(_ITEM),
    "response.mcp_call.failed": _t(_ITEM),
    "response.mcp_call_arguments.delta": _t({**_ITEM, "delta": (STR,)}),
    "response.mcp_call_arguments.done": _t({**_ITEM, "arguments": (STR,)}),
}

# Codex's own events (its WebSocket reads them, ``codex-api/src/endpoint/responses_websocket.rs``):
# they carry no sequence number; ``tests/support/oracle.py`` parses them as Codex does.
CODEX_EVENTS: dict[str, Table] = {
    "codex.rate_limits": _t({"rate_limits": (OBJ,)}),  # RATE-6
}

# ----------------------------------------------------------------------------- the checker


def _describe(spec: Spec) -> str:
    if isinstance(spec, Obj):
        return f"object ({spec.table})" + (" or null" if spec.nullable else "")
    if isinstance(spec, ArrayOf):
        return f"array of {spec.union}"
    if isinstance(spec, Tagged):
        return f"object ({spec.union})" + (" or null" if spec.nullable else "")
    if isinstance(spec, OneOf):
        return " | ".join(map(repr, spec.values)) + (" | null" if spec.nullable else "")
    return " or ".join(spec)


def _union_member(union: str, value: Any) -> str | None:
    """The table for one element of a ``type``-tagged union, or None when the document does
    not define that type (those elements are left to the SDK oracle)."""
    kind = value.get("type") if isinstance(value, dict) else None
    name = f"{union}.{kind}"
    return name if name in TABLES else None


def check_value(value: Any, spec: Spec, path: str, faults: list[str]) -> None:
    if isinstance(spec, tuple):
        if not any(json_type_ok(value, kind) for kind in spec):
            faults.append(f"{path}: expected {_describe(spec)}, got {value!r:.60}")
    elif isinstance(spec, OneOf):
        if not (value in spec.values or (spec.nullable and value is None)):
            faults.append(f"{path}: expected {_describe(spec)}, got {value!r:.60}")
    elif isinstance(spec, Obj):
        if value is None and spec.nullable:
            return
        if not isinstance(value, dict):
            faults.append(f"{path}: expected {_describe(spec)}, got {value!r:.60}")
            return
        check_object(value, TABLES[spec.table], path, faults)
    elif isinstance(spec, Tagged):
        if value is None and spec.nullable:
            return
        if not isinstance(value, dict):
            faults.append(f"{path}: expected {_describe(spec)}, got {value!r:.60}")
            return
        member = _union_member(spec.union, value)
        if member is not None:
            check_object(value, TABLES[member], path, faults)
    else:
        if not isinstance(value, list):
            faults.append(f"{path}: expected {_describe(spec)}, got {value!r:.60}")
            return
        for index, element in enumerate(value):
            member = _union_member(spec.union, element)
            if member is not None:
                check_object(element, TABLES[member], f"{path}[{index}]", faults)


def check_object(raw: dict[str, Any], table: Table, path: str, faults: list[str]) -> None:
    for name, spec in table.required.items():
        where = f"{path}.{name}" if path else name
        if name not in raw:
            faults.append(f"{where}: required field missing")
        else:
            check_value(raw[name], spec, where, faults)
    for name, spec in table.optional.items():
        if name in raw:
            check_value(raw[name], spec, f"{path}.{name}" if path else name, faults)


def check_event(raw: dict[str, Any]) -> list[str]:
    """Faults of one server event (WebSocket frame or SSE ``data``) against the tables."""
    faults: list[str] = []
    kind = raw.get("type")
    if kind == "error":
        check_object(raw, WS_ERROR, "", faults)
        return faults
    if isinstance(kind, str) and kind in CODEX_EVENTS:
        check_object(raw, CODEX_EVENTS[kind], "", faults)
        return faults
    table = EVENTS.get(kind) if isinstance(kind, str) else None
    table = table or (NON_DOCUMENT_EVENTS.get(kind) if isinstance(kind, str) else None)
    if table is None:
        return [f"type: {kind!r} is neither an Open Responses event nor a documented extension"]
    check_value(raw.get("sequence_number"), (INT,), "sequence_number", faults)
    check_object(raw, table, "", faults)
    return faults


def check_body(raw: dict[str, Any]) -> list[str]:
    """Faults of one HTTP JSON body: a Response, a compacted response, or an error body."""
    faults: list[str] = []
    kind = raw.get("object")
    if kind == "response" and "deleted" not in raw:
        check_object(raw, TABLES["Response"], "", faults)
    elif kind == "response.compaction":
        check_object(raw, TABLES["Compaction"], "", faults)
    elif "error" in raw and isinstance(raw["error"], dict):
        check_object(raw["error"], TABLES["ErrorPayload"], "error", faults)
    return faults


CHECKED_EVENT_TYPES = (
    frozenset(EVENTS) | {"error"} | frozenset(NON_DOCUMENT_EVENTS) | frozenset(CODEX_EVENTS)
)
