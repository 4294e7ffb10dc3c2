"""``qwen3_coder`` (Qwen3-Coder, Qwen3.5; SPEC: PARSE-5): a call is

    <tool_call>
    <function=NAME>
    <parameter=P>
    VALUE
    </parameter>
    </function>
    </tool_call>

Values are text typed by the tool's JSON schema, as vLLM's ``qwen3coder`` parser types them
(``vllm/tool_parsers/qwen3coder_tool_parser.py``, ``_convert_param_value``): one newline
after the opening and before the closing parameter tag is dropped; a parameter the schema does
not declare, or a string type, stays text; integers, numbers and booleans are converted
(``null``/``None`` to null for non-string types); objects and arrays are read as JSON, then as
a Python literal; a value that does not convert stays text."""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Mapping
from typing import Any

from engine.models.tokens.parsers.tagged import TaggedCalls

_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*?)(?:</function>\s*)?\Z", re.S)
_PARAMETER = re.compile(
    r"<parameter=(.*?)(?:</parameter>|(?=<parameter=)|(?=</function>)|\Z)", re.S
)
_STRINGS = frozenset({"string", "str", "text", "varchar", "char", "enum"})


class Qwen3CoderParser(TaggedCalls):
    @staticmethod
    def sample(name: str, arguments: dict[str, Any]) -> str:
        params = "".join(
            f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v)}\n</parameter>\n"
            for k, v in arguments.items()
        )
        return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"

    def read(self, body: str) -> tuple[str, Any] | None:
        match = _FUNCTION.match(body)
        if match is None:
            return None
        name, rest = match.group(1).strip(), match.group(2)
        schema = self.tools.get(name, {})
        properties = schema.get("properties") if isinstance(schema, Mapping) else None
        if not isinstance(properties, Mapping):
            properties = {}
        arguments: dict[str, Any] = {}
        for found in _PARAMETER.findall(rest):
            key, sep, value = found.partition(">")
            if not sep:
                return None  # ``<parameter=name`` without its ``>``
            value = value.removeprefix("\n").removesuffix("\n")
            arguments[key] = typed(value, properties.get(key))
        return name, arguments


def _declared_type(schema: Any) -> tuple[str, bool]:
    """(the schema's first non-null type, whether null is allowed)."""
    if not isinstance(schema, Mapping):
        return "string", False
    if "type" in schema:
        kind = schema["type"]
        if isinstance(kind, list):  # ``["integer", "null"]``
            names = [str(k).lower() for k in kind]
            rest = [k for k in names if k != "null"]
            return (rest[0] if rest else "null"), "null" in names
        kind = str(kind).strip().lower()
        return kind, kind == "null"
    for option in schema.get("anyOf", []):
        if isinstance(option, Mapping) and "type" in option:
            kind = str(option["type"]).strip().lower()
            if kind != "null":
                nullable = any(
                    isinstance(o, Mapping) and o.get("type") == "null" for o in schema["anyOf"]
                )
                return kind, nullable
    return "string", False


def typed(value: str, schema: Any) -> Any:
    """A parameter's text as the value its schema declares (vLLM's conversion rules)."""
    if schema is None:
        return value
    kind, nullable = _declared_type(schema)
    if nullable and value.lower() in ("null", "none"):
        return None
    if kind in _STRINGS:
        return value
    if value.lower() in ("null", "none"):
        return None
    if kind.startswith(("int", "uint", "long", "short", "unsigned")):
        try:
            return int(value)
        except ValueError:
            return value
    if kind.startswith(("num", "float")):
        try:
            number = float(value)
        except ValueError:
            return value
        if not math.isfinite(number):
            return value
        return int(number) if number.is_integer() else number
    if kind in ("boolean", "bool", "binary"):
        return value.lower() == "true"
    return _literal(value, kind in ("object", "array", "arr") or kind.startswith(("dict", "list")))


def _literal(value: str, container: bool) -> Any:
    if container:
        try:
            return json.loads(value)
        except ValueError:
            pass
    try:
        parsed = ast.literal_eval(value)
        json.dumps(parsed, allow_nan=False)  # a set, bytes or a tuple key has no JSON form
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return value
    return parsed
