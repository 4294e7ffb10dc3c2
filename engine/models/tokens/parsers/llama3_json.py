"""``llama3_json`` (Llama 3.1-3.3 and 4 with JSON tool calling; SPEC: PARSE-6), as vLLM's
``llama3_json`` parser reads it: an answer that starts (after whitespace) with
``<|python_tag|>`` or ``{`` is calls, ``{"name": ..., "parameters"|"arguments": {...}}``, several
separated by ``;``. Any other answer is message text. A JSON value that is not such a call, or
JSON that never completes, stays text (counted); text after the last call is message text."""

from __future__ import annotations

import json
from typing import Any

from engine.models.base import Delta
from engine.models.tokens.parsers.common import (
    ToolParser,
    ToolSchemas,
    json_value,
    named_call,
    skip_space,
)


class Llama3JsonParser(ToolParser):
    TAG = "<|python_tag|>"
    markers = (TAG,)
    sample_prose = False  # an answer is calls or text, not both
    sample_separator = "; "

    @staticmethod
    def sample(name: str, arguments: dict[str, Any]) -> str:
        return json.dumps({"name": name, "parameters": arguments})

    def __init__(self, tools: ToolSchemas | None = None) -> None:
        super().__init__(tools)
        self._mode = "start"  # start (undecided) | calls | text
        self._buffer = ""  # start: the held opening; calls: the calls' text
        self._pos = 0  # calls: where the next call starts in ``_buffer``
        self._tagged = False  # the calls opened with the tag (kept visible if unreadable)

    def feed(self, text: str) -> list[Delta]:
        if self._mode == "text":
            return self._prose.text(text)
        self._buffer += text
        if self._mode == "start":
            return self._decide()
        return self._read_calls() if any(c in text for c in "}]") else []

    def _decide(self) -> list[Delta]:
        head = self._buffer.lstrip()
        if not head or (len(head) < len(self.TAG) and self.TAG.startswith(head)):
            return []  # still whitespace, or a prefix of the tag
        if head.startswith((self.TAG, "{")):
            self._mode = "calls"
            self._tagged = head.startswith(self.TAG)
            self._buffer = head.removeprefix(self.TAG)
            return self._read_calls()
        self._mode = "text"
        text, self._buffer = self._buffer, ""
        return self._prose.text(text)

    def _read_calls(self) -> list[Delta]:
        out: list[Delta] = []
        while True:
            start = skip_space(self._buffer, self._pos, ";" if self.calls else "")
            if start >= len(self._buffer):
                return out
            if self.calls and self._buffer[start] != "{":  # text after the calls
                self._mode = "text"
                rest, self._buffer = self._buffer[start:], ""
                return out + self._prose.text(rest)
            found = json_value(self._buffer, start)
            if found is None:
                return out  # incomplete: wait (or keep it as text at the end)
            value, end = found
            call = named_call(value)
            if call is None:
                self._mode = "text"
                rest, self._buffer = self._buffer[start:], ""
                return out + self._prose.kept(self._opening() + rest)
            out.extend(self._prose.call(*call))
            self._pos = end

    def _opening(self) -> str:
        return self.TAG if self._tagged and not self.calls else ""

    def finish(self) -> list[Delta]:
        out: list[Delta] = []
        if self._mode == "start" and self._buffer.strip():
            out = self._prose.text(self._buffer)  # only a prefix of the tag was sampled
        elif self._mode == "calls":
            out = self._read_calls()
            if self._mode == "calls":
                rest = self._buffer[skip_space(self._buffer, self._pos, ";") :]
                if rest:
                    out += self._prose.kept(self._opening() + rest)
        self._buffer = ""
        return out + self._prose.flush()
