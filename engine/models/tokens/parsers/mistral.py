"""``mistral`` (Mistral, Mixtral, Ministral, Devstral, Magistral; SPEC: PARSE-7), as vLLM's
``mistral`` parser reads both tokenizer generations: text up to ``[TOOL_CALLS]`` is message
text; after it either a JSON array of ``{"name", "arguments"}`` objects (tokenizers before v11)
or ``name[ARGS]{...}`` (v11 and later; ``name{...}`` when ``[ARGS]`` is not a token), one per
``[TOOL_CALLS]``. A call that does not read that way, or never completes, stays text
(counted)."""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from engine.models.base import Delta
from engine.models.tokens.parsers.common import (
    ToolParser,
    ToolSchemas,
    json_value,
    named_call,
    partial_suffix,
    skip_space,
)

_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
MAX_NAME_CHARS = 256  # text after the marker without ``{`` or ``[`` this long is no call
# What reading a call found: its calls and where it ends, "wait" (incomplete) or "bad".
Found = tuple[list[tuple[str, Any]], int] | Literal["wait", "bad"]


class MistralParser(ToolParser):
    MARK = "[TOOL_CALLS]"
    ARGS = "[ARGS]"
    markers = (MARK, ARGS, "[CALL_ID]")

    @staticmethod
    def sample(name: str, arguments: dict[str, Any]) -> str:
        return f"[TOOL_CALLS]{name}[ARGS]{json.dumps(arguments)}"

    def __init__(self, tools: ToolSchemas | None = None) -> None:
        super().__init__(tools)
        self._text = ""  # outside a call: held text that may start the marker
        self._call: str | None = None  # after the marker: the call's text so far

    def feed(self, text: str) -> list[Delta]:
        out: list[Delta] = []
        if self._call is not None:
            self._call += text
            if any(c in text for c in "{}[]"):  # nothing else can complete or spoil a call
                out += self._read()
        else:
            self._text += text
        while self._call is None and self._text:
            at = self._text.find(self.MARK)
            if at < 0:
                keep = partial_suffix(self._text, self.MARK)
                cut = len(self._text) - keep
                out += self._prose.text(self._text[:cut])
                self._text = self._text[cut:]
                break
            out += self._prose.text(self._text[:at], final=True)
            self._call, self._text = self._text[at + len(self.MARK) :], ""
            out += self._read()
        return out

    def _read(self) -> list[Delta]:
        """Try to complete the call after the marker; what follows it is text again."""
        assert self._call is not None
        body = self._call
        start = skip_space(body, 0)
        if start >= len(body):
            return []
        if body.startswith(self.MARK, start):
            found: Found = "bad"  # a marker with no call before the next one
        elif body[start] == "[":
            found = self._array(body, start)
        else:
            found = self._named(body, start)
        if found == "wait":
            return []
        if found == "bad":
            return self._give_up()
        calls, end = found
        self._call, self._text = None, body[end:]
        return [d for name, arguments in calls for d in self._prose.call(name, arguments)]

    def _array(self, body: str, start: int) -> Found:
        found = json_value(body, start)
        if found is None:
            return "wait"
        value, end = found
        calls = [named_call(item) for item in value] if isinstance(value, list) else [None]
        if not calls or any(call is None for call in calls):
            return "bad"
        return [c for c in calls if c is not None], end

    def _named(self, body: str, start: int) -> Found:
        brace = body.find("{", start)
        if brace < 0:
            return "bad" if len(body) - start > MAX_NAME_CHARS else "wait"
        head = body[start:brace].replace(self.ARGS, "")
        name = head.split("[CALL_ID]")[0].strip()
        if not _NAME.fullmatch(name):
            return "bad"
        found = json_value(body, brace)
        if found is None:
            return "wait"
        arguments, end = found
        if not isinstance(arguments, dict):
            return "bad"
        return [(name, arguments)], end

    def _give_up(self) -> list[Delta]:
        """Kept as text up to the next marker; what follows is read again (so where the
        stream was split never changes what is a call)."""
        body, self._call = self._call or "", None
        cut = body.find(self.MARK)
        if cut < 0:  # the end may still start the next marker
            cut = len(body) - partial_suffix(body, self.MARK)
        out = self._prose.kept(self.MARK + body[:cut])
        return out + self.feed(body[cut:]) if cut < len(body) else out

    def finish(self) -> list[Delta]:
        out: list[Delta] = self._read() if self._call is not None else []
        while self._call is not None:
            out += self._give_up()
        if self._text.strip():
            out += self._prose.text(self._text)
        self._text = ""
        return out + self._prose.flush()
