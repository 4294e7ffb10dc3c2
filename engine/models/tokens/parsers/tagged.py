"""Calls between an opening and a closing tag (SPEC: TOK-6, PARSE-2, PARSE-3), the shape of
``hermes`` and ``qwen3_coder``: a format names its tags and reads a call's body."""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

from engine.models.base import Delta
from engine.models.tokens.parsers.common import ToolParser, ToolSchemas
from engine.models.tokens.parsers.common import partial_suffix as _partial_suffix


class TaggedCalls(ToolParser):
    """Calls between an opening and a closing tag; ``read`` turns a body into (name,
    arguments), or None for a malformed call. Subclasses name the tags and the body's format."""

    OPEN = "<tool_call>"
    CLOSE = "</tool_call>"
    markers = (OPEN, CLOSE)

    def __init__(self, tools: ToolSchemas | None = None) -> None:
        super().__init__(tools)
        self._held = ""  # text that may be the start of a tag
        self._inside: list[str] | None = None  # a call's body being collected

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
                out.extend(self._prose.text(data[: len(data) - keep]))
                self._held = data[len(data) - keep :]
                return out
            out.extend(self._prose.text(data[:start], final=True))
            self._inside = []
            data = data[start + len(self.OPEN) :]
        return out

    @abstractmethod
    def read(self, body: str) -> tuple[str, Any] | None:
        """A call's body -> (name, arguments), or None for a malformed call."""

    def _call(self, body: str) -> list[Delta]:
        call = self.read(body)
        if call is None:
            return self._prose.kept(self.OPEN + body + self.CLOSE)
        return self._prose.call(*call)

    def finish(self) -> list[Delta]:
        held, self._held = self._held, ""
        if self._inside is not None:  # an unclosed call: what was sampled stays visible
            text = self.OPEN + "".join(self._inside) + held
            self._inside = None
            return self._prose.kept(text) + self._prose.flush()
        out = self._prose.text(held) if held.strip() else []
        return out + self._prose.flush()
