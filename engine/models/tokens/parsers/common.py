"""What every tool parser shares (SPEC: PARSE-1..PARSE-3): the ``ToolParser`` base, the
held-back tail that may be the start of a marker, message text with whitespace around calls
dropped, and a call's deltas."""

from __future__ import annotations

import json
import secrets
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

from engine.models.base import ArgsDelta, CallEnd, CallStart, Delta, TextDelta

# A function tool's name -> its JSON schema for ``parameters`` (qwen3_coder types values by it).
ToolSchemas = Mapping[str, Mapping[str, Any]]


def partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``. Only
    places holding the tag's first character are tried (the hot path: most text has none)."""
    at = text.find(tag[0], max(0, len(text) - len(tag) + 1))
    while at >= 0:
        if tag.startswith(text[at:]):
            return len(text) - at
        at = text.find(tag[0], at + 1)
    return 0


def held_tail(text: str, tags: tuple[str, ...]) -> int:
    """How much of ``text``'s end may still become one of ``tags``."""
    return max((partial_suffix(text, tag) for tag in tags), default=0)


def call_deltas(name: str, arguments: Any) -> list[Delta]:
    """One complete function call: a fresh ``call_id``, the arguments as JSON text."""
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return [CallStart("call_" + secrets.token_hex(12), name), ArgsDelta(text), CallEnd()]


class Prose:
    """Message text between calls (PARSE-2). Whitespace that opens a segment (the start, or
    after a call) is held until real text follows; it is dropped before a call (``final``) and
    after one. ``calls`` counts the calls made, which every parser reports."""

    def __init__(self) -> None:
        self.calls = 0
        self.malformed = 0  # calls kept as text (PARSE-3)
        self._whitespace = ""
        self._segment_open = False

    def text(self, text: str, *, final: bool = False) -> list[Delta]:
        if self._segment_open:
            return [TextDelta(text)] if text else []
        text = self._whitespace + text
        if not text.strip():
            self._whitespace = "" if final else text
            return []
        self._whitespace = ""
        self._segment_open = True
        return [TextDelta(text.lstrip() if self.calls else text)]

    def call(self, name: str, arguments: Any) -> list[Delta]:
        self.calls += 1
        self._segment_open = False
        self._whitespace = ""
        return call_deltas(name, arguments)

    def kept(self, raw: str) -> list[Delta]:
        """A call that could not be read: what was sampled stays visible, and is counted."""
        self.malformed += 1
        return self.text(raw)

    def flush(self) -> list[Delta]:
        """The end of the answer: whitespace still held is dropped (an answer of only
        whitespace has no message)."""
        self._whitespace = ""
        return []


def json_object(body: str) -> dict[str, Any] | None:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def named_call(value: Any) -> tuple[str, Any] | None:
    """``{"name": str, "arguments"|"parameters": {...}}`` -> (name, arguments), else None."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if not isinstance(arguments, dict | str):
        return None
    return value["name"], arguments


_DECODER = json.JSONDecoder()


def json_value(text: str, start: int) -> tuple[Any, int] | None:
    """The JSON value at ``text[start:]`` and where it ends; None while it is incomplete or
    not JSON (the caller waits for more text, and keeps it as text at the end)."""
    try:
        return _DECODER.raw_decode(text, start)
    except ValueError:
        return None


def skip_space(text: str, start: int, also: str = "") -> int:
    while start < len(text) and (text[start].isspace() or text[start] in also):
        start += 1
    return start


class ToolParser(ABC):
    """One generation's decoded text -> message text and function calls (TOK-6). A parser is
    made per generation with the request's function tools (name -> ``parameters`` schema); it
    emits through a ``Prose``, which counts the calls it produced and the malformed ones it
    left as text (PARSE-3). Each format carries its own sample, so one benchmark
    (``bench/tool_parser_cpu.py``) iterates the registry."""

    # Texts that must reach ``feed`` even when the tokenizer marks them special (TOK-30).
    markers: ClassVar[tuple[str, ...]] = ()
    # How the sample answer joins calls: after a sentence of text each (``sample_prose``), or
    # calls only (a format that reads an answer as calls or as text, not both).
    sample_prose: ClassVar[bool] = True
    sample_separator: ClassVar[str] = "\n"

    def __init__(self, tools: ToolSchemas | None = None) -> None:
        self.tools: ToolSchemas = tools or {}
        self._prose = Prose()

    @property
    def calls(self) -> int:
        """Function calls produced so far."""
        return self._prose.calls

    @property
    def malformed(self) -> int:
        """Calls that could not be read and stayed text (PARSE-3)."""
        return self._prose.malformed

    @abstractmethod
    def feed(self, text: str) -> list[Delta]: ...

    @abstractmethod
    def finish(self) -> list[Delta]: ...

    @staticmethod
    @abstractmethod
    def sample(name: str, arguments: dict[str, Any]) -> str:
        """One call of ``name`` with ``arguments`` as the model samples it in this format."""
