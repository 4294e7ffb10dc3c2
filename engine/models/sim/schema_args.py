"""Arguments the simulator sends: valid for the tool's JSON Schema, plausible by name (SIM-7).

Validity: every ``required`` property gets a value (every declared property when the schema has
no ``required`` list, and optional ones up to ``minProperties``); ``integer`` and ``number``
values are whole numbers written without a fraction whenever the bounds allow one (a client may
parse a ``number`` as an unsigned integer); ``enum`` and ``const`` are honoured; bounds
(``minimum``, ``maximum``, their exclusive forms, ``multipleOf``), string and array lengths,
nested objects and arrays, ``$ref`` into ``$defs``/``definitions``, ``anyOf``/``oneOf`` (the
first option that is not ``null``) and ``allOf`` (merged) are followed. Only declared properties
are emitted, so ``additionalProperties: false`` holds. Not followed: ``pattern``, ``format``,
``uniqueItems`` with more than one required item, ``not``, and ``if``/``then``.

Plausibility, by the parameter's name (lower-cased):

* command-like (``cmd``, ``command``, ``script``, …) → ``"ls"``, a short read-only command
  (``["ls"]`` for an array of strings);
* path-like (``path``, ``dir``, ``cwd``, ``workdir``, ``file``, …) → ``"."``;
* time in milliseconds or a timeout (``*_ms``, ``timeout*``) → 1000;
* a limit or a budget (``max_*``, ``limit``, ``*tokens``, ``count``) → 1000;
* any other string → the hint (a word of the user's text); any other number → 1.
"""

from __future__ import annotations

import math
from typing import Any

MAX_DEPTH = 32
_COMMAND_NAMES = ("cmd", "command", "script", "shell")
_PATH_NAMES = ("path", "dir", "directory", "cwd", "workdir", "folder", "file", "filename", "root")
_MS_NAMES = ("_ms", "timeout", "millis")
_LIMIT_NAMES = ("max_", "limit", "tokens", "count", "budget", "size")


def arguments_for(schema: dict[str, Any] | None, hint: str) -> dict[str, Any]:
    """Arguments for a function whose ``parameters`` are ``schema`` (an object schema)."""
    root = schema or {}
    value = _Generator(root, hint).value(root, "", 0)
    return value if isinstance(value, dict) else {}


def command_like(name: str) -> bool:
    lowered = name.lower()
    return any(lowered == n or lowered.endswith(f"_{n}") for n in _COMMAND_NAMES)


def _path_like(name: str) -> bool:
    lowered = name.lower()
    return any(lowered == n or lowered.endswith(f"_{n}") for n in _PATH_NAMES)


class _Generator:
    __slots__ = ("hint", "root")

    def __init__(self, root: dict[str, Any], hint: str) -> None:
        self.root = root
        self.hint = hint

    def value(self, schema: Any, name: str, depth: int) -> Any:
        schema = self._resolve(schema if isinstance(schema, dict) else {}, depth)
        if "const" in schema:
            return schema["const"]
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            return schema["enum"][0]
        kind = _kind(schema)
        if kind == "object":
            return self._object(schema, depth) if depth < MAX_DEPTH else {}
        if kind == "array":
            return self._array(schema, name, depth)
        if kind in ("integer", "number"):
            return _number(schema, name, kind == "integer")
        if kind == "boolean":
            return True
        if kind == "null":
            return None
        return self._string(schema, name)

    def _resolve(self, schema: dict[str, Any], depth: int) -> dict[str, Any]:
        """Follow ``$ref``, pick an ``anyOf``/``oneOf`` option, merge ``allOf``."""
        for _ in range(MAX_DEPTH):
            ref = schema.get("$ref")
            if isinstance(ref, str):
                schema = {**self._lookup(ref), **{k: v for k, v in schema.items() if k != "$ref"}}
                continue
            options = schema.get("anyOf") or schema.get("oneOf")
            if isinstance(options, list) and options:
                chosen = next((o for o in options if _kind(o) != "null"), options[0])
                rest = {k: v for k, v in schema.items() if k not in ("anyOf", "oneOf")}
                schema = {**rest, **(chosen if isinstance(chosen, dict) else {})}
                continue
            parts = schema.get("allOf")
            if isinstance(parts, list) and parts:
                schema = _merge({k: v for k, v in schema.items() if k != "allOf"}, parts)
                continue
            break
        return schema

    def _lookup(self, ref: str) -> dict[str, Any]:
        node: Any = self.root
        for key in ref.removeprefix("#/").split("/") if ref.startswith("#/") else []:
            node = node.get(key) if isinstance(node, dict) else None
        return node if isinstance(node, dict) else {}

    def _object(self, schema: dict[str, Any], depth: int) -> dict[str, Any]:
        props = schema.get("properties")
        props = props if isinstance(props, dict) else {}
        required = schema.get("required")
        names = [n for n in required if isinstance(n, str)] if isinstance(required, list) else []
        if not isinstance(required, list):
            names = list(props)
        wanted = schema.get("minProperties")
        if isinstance(wanted, int):
            names += [n for n in props if n not in names][: max(wanted - len(names), 0)]
        return {n: self.value(props.get(n, {}), n, depth + 1) for n in dict.fromkeys(names)}

    def _array(self, schema: dict[str, Any], name: str, depth: int) -> list[Any]:
        lowest = schema.get("minItems")
        count = lowest if isinstance(lowest, int) and lowest > 0 else 0
        items = schema.get("items")
        if count == 0 and command_like(name) and _kind(items) in ("string", None):
            count = 1
        highest = schema.get("maxItems")
        if isinstance(highest, int):
            count = min(count, highest)
        if depth >= MAX_DEPTH:
            return []
        return [self.value(items, name, depth + 1) for _ in range(count)]

    def _string(self, schema: dict[str, Any], name: str) -> str:
        if command_like(name):
            text = "ls"
        elif _path_like(name):
            text = "."
        else:
            text = self.hint
        lowest, highest = schema.get("minLength"), schema.get("maxLength")
        if isinstance(lowest, int) and len(text) < lowest:
            text = text + "x" * (lowest - len(text))
        if isinstance(highest, int) and len(text) > highest:
            text = text[: max(highest, 0)]
        return text


def _kind(schema: Any) -> str | None:
    if not isinstance(schema, dict):
        return None
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null" if kind else None)
    if isinstance(kind, str):
        return kind
    if "properties" in schema or "required" in schema:
        return "object"
    if "items" in schema:
        return "array"
    return None


def _merge(base: dict[str, Any], parts: list[Any]) -> dict[str, Any]:
    merged = dict(base)
    for part in parts:
        if not isinstance(part, dict):
            continue
        for key, value in part.items():
            if key == "properties" and isinstance(merged.get(key), dict):
                merged[key] = {**merged[key], **value}
            elif key == "required" and isinstance(merged.get(key), list):
                merged[key] = [*merged[key], *value]
            else:
                merged.setdefault(key, value)
    return merged


def _number(schema: dict[str, Any], name: str, integer: bool) -> int | float:
    """The plausible value moved into the bounds; a whole number whenever the bounds hold one
    that is a multiple of ``multipleOf``."""
    lowered = name.lower()
    plausible_big = any(n in lowered for n in _MS_NAMES + _LIMIT_NAMES)
    wanted = 1000 if plausible_big else 1
    lo, hi = _bounds(schema)
    raw_step = schema.get("multipleOf")
    step: float = 1
    if isinstance(raw_step, int | float) and not isinstance(raw_step, bool) and raw_step > 0:
        step = raw_step
    unit = int(step) if float(step).is_integer() else 1
    for candidate in _whole_candidates(wanted, lo, hi, unit):
        if _inside(candidate, lo, hi) and _multiple(candidate, step):
            return candidate
    if integer:  # no whole number fits: the schema cannot be satisfied; stay plausible
        return wanted
    return _fraction_in(lo, hi, step)


def _whole_candidates(
    wanted: int, lo: tuple[float, bool] | None, hi: tuple[float, bool] | None, unit: int
) -> list[int]:
    """Multiples of ``unit`` near the wanted value and near each bound, nearest first."""
    anchors = [float(wanted)] + [b[0] for b in (lo, hi) if b is not None]
    found: set[int] = set()
    for anchor in anchors:
        base = math.floor(anchor / unit) * unit
        found.update(int(base + k * unit) for k in (-1, 0, 1, 2))
    return sorted(found, key=lambda c: (abs(c - wanted), c))


def _multiple(value: int, step: float) -> bool:
    """As JSON Schema validators check it: the quotient is a whole number."""
    if step == 1:
        return True
    quotient = value / step
    return quotient == int(quotient)


def _bounds(schema: dict[str, Any]) -> tuple[tuple[float, bool] | None, tuple[float, bool] | None]:
    """The tightest lower and upper bound, each as (value, exclusive)."""
    lower = _bound_list(schema, "minimum", "exclusiveMinimum")
    upper = _bound_list(schema, "maximum", "exclusiveMaximum")
    # On a tie the exclusive bound is the tighter one.
    low = max(lower, key=lambda b: (b[0], b[1])) if lower else None
    high = min(upper, key=lambda b: (b[0], not b[1])) if upper else None
    return low, high


def _bound_list(schema: dict[str, Any], inclusive: str, exclusive: str) -> list[tuple[float, bool]]:
    found: list[tuple[float, bool]] = []
    for key, strict in ((inclusive, False), (exclusive, True)):
        value = schema.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            found.append((float(value), strict))
    return found


def _inside(x: float, lo: tuple[float, bool] | None, hi: tuple[float, bool] | None) -> bool:
    if lo is not None and (x < lo[0] or (lo[1] and x == lo[0])):
        return False
    return not (hi is not None and (x > hi[0] or (hi[1] and x == hi[0])))


def _fraction_in(
    lo: tuple[float, bool] | None, hi: tuple[float, bool] | None, step: float
) -> float:
    """A value inside the bounds when no whole number fits (e.g. between 0.2 and 0.5)."""
    low = lo[0] if lo is not None else (hi[0] - 1 if hi is not None else 0.0)
    high = hi[0] if hi is not None else low + 1
    if step != 1:
        n = math.ceil(low / step)
        while not _inside(n * step, lo, hi) and n * step <= high:
            n += 1
        return n * step
    return (low + high) / 2
