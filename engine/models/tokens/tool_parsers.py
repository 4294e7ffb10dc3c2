"""Sampled text -> message text and function calls (SPEC: TOK-6).

A parser is fed the decoded text as it streams and returns deltas; ``finish`` flushes what it
holds. Parsers are registered by name in ``PARSERS`` (the route's ``tool_parser``), so another
format is one class more.

``hermes`` (Qwen2.5/Qwen3, Hermes, many fine-tunes): a call is
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` anywhere in the text. Text before,
between and after calls is message text, except whitespace around calls. A call's JSON is
parsed when its closing tag arrives; one that is not a JSON object with a string ``name`` is
kept as text rather than guessed at.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from typing import Protocol

from engine.models.base import ArgsDelta, CallEnd, CallStart, Delta, TextDelta


class ToolParser(Protocol):
    calls: int  # function calls produced so far

    def feed(self, text: str) -> list[Delta]: ...

    def finish(self) -> list[Delta]: ...


class HermesParser:
    OPEN = "<tool_call>"
    CLOSE = "</tool_call>"

    def __init__(self) -> None:
        self.calls = 0
        self._held = ""  # text that may be the start of a tag, or whitespace before a call
        self._inside: list[str] | None = None  # a call's JSON being collected
        self._whitespace = ""  # whitespace-only text opening a segment
        self._segment_open = False  # real text emitted since the start or the last call

    def feed(self, text: str) -> list[Delta]:
        out: list[Delta] = []
        data = self._held + text
        self._held = ""
        while data:
            if self._inside is not None:
                end = data.find(self.CLOSE)
                if end < 0:
                    keep = _partial_suffix(data, self.CLOSE)
                    self._inside.append(data[: len(data) - keep])
                    self._held = data[len(data) - keep :]
                    return out
                self._inside.append(data[:end])
                out.extend(self._call("".join(self._inside)))
                self._inside = None
                data = data[end + len(self.CLOSE) :]
                continue
            start = data.find(self.OPEN)
            if start < 0:
                keep = _partial_suffix(data, self.OPEN)
                out.extend(self._text(data[: len(data) - keep], final=False))
                self._held = data[len(data) - keep :]
                return out
            out.extend(self._text(data[:start], final=True))
            self._inside = []
            data = data[start + len(self.OPEN) :]
        return out

    def _text(self, text: str, *, final: bool) -> list[Delta]:
        """Message text. Whitespace that opens a segment (the start, or after a call) is held
        until real text follows, and dropped after a call or before one (``final``)."""
        if self._segment_open:
            return [TextDelta(text)] if text else []
        text = self._whitespace + text
        if not text.strip():
            self._whitespace = "" if final else text
            return []
        self._whitespace = ""
        self._segment_open = True
        return [TextDelta(text.lstrip() if self.calls else text)]

    def _call(self, body: str) -> list[Delta]:
        try:
            value = json.loads(body)
        except ValueError:
            value = None
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            return [TextDelta(self.OPEN + body + self.CLOSE)]
        arguments = value.get("arguments", value.get("parameters", {}))
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        self.calls += 1
        self._segment_open = False
        call_id = "call_" + secrets.token_hex(12)
        return [CallStart(call_id, value["name"]), ArgsDelta(arguments), CallEnd()]

    def finish(self) -> list[Delta]:
        held, self._held = self._held, ""
        if self._inside is not None:  # an unclosed call: what was sampled stays visible
            text = self.OPEN + "".join(self._inside) + held
            self._inside = None
            return self._text(text, final=False)
        return self._text(held, final=False) if held.strip() else []


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


# name (the route's ``tool_parser``) -> a factory of one parser per generation
PARSERS: dict[str, Callable[[], ToolParser]] = {"hermes": HermesParser}
