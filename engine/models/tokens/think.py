"""``reasoning_parser = "think"``: ``<think>…</think>`` as Qwen3 and DeepSeek-R1 sample it
(SPEC: REASON-1).

The reasoning is the text between the tags, without the newlines that open and close it (the
templates put them back when they render the text, ``reasoning_content.strip('\\n')``). It
starts at a ``<think>`` the model samples before anything but whitespace, or at once when the
template's generation prompt already ends with ``<think>`` (DeepSeek-R1's). What follows
``</think>`` (leading whitespace dropped) goes to the tool parser. A ``<think>`` later in the
answer is text; a reasoning span that never closes stays reasoning (the generation was cut
short) and is counted (``reasoning.unclosed``).
"""

from __future__ import annotations

from collections import Counter
from typing import ClassVar

from engine.models.base import Delta, ReasoningDelta
from engine.models.tokens.reasoning import PlainText, TextReasoning
from engine.models.tokens.tool_parsers import ToolParser, ToolSchemas

_START, _REASONING, _AFTER, _CONTENT = range(4)


class ThinkParser(TextReasoning):
    """``<think>`` reasoning, then the tool parser's text and calls (REASON-1)."""

    OPEN = "<think>"
    CLOSE = "</think>"

    def __init__(self, inner: ToolParser, started: bool, stats: Counter[str]) -> None:
        super().__init__(inner)
        self._stats = stats
        self._state = _REASONING if started else _START
        self._held = ""  # a possible tag's start, or whitespace before ``<think>``
        self._leading = True  # the reasoning's opening newlines are still dropped
        self._newlines = ""  # newlines at the reasoning's end so far: dropped before the close

    @property
    def in_reasoning(self) -> bool:
        return self._state == _REASONING

    def feed(self, text: str) -> list[Delta]:
        out: list[Delta] = []
        data, self._held = self._held + text, ""
        while data:
            if self._state == _START:
                stripped = data.lstrip()
                if len(stripped) < len(self.OPEN) and self.OPEN.startswith(stripped):
                    self._held = data  # whitespace, or the start of ``<think>``: wait
                    return out
                if stripped.startswith(self.OPEN):
                    self._state, data = _REASONING, stripped[len(self.OPEN) :]
                else:
                    self._state = _CONTENT
            elif self._state == _REASONING:
                end = data.find(self.CLOSE)
                if end < 0:
                    keep = _partial_suffix(data, self.CLOSE)
                    out.extend(self._reasoning(data[: len(data) - keep]))
                    self._held = data[len(data) - keep :]
                    return out
                out.extend(self._reasoning(data[:end]))
                self._newlines = ""
                self._state, data = _AFTER, data[end + len(self.CLOSE) :]
            elif self._state == _AFTER:
                data = data.lstrip()
                if data:
                    self._state = _CONTENT
            else:
                out.extend(self._inner.feed(data))
                return out
        return out

    def _reasoning(self, text: str) -> list[Delta]:
        if self._leading:
            text = text.lstrip("\n")
            if not text:
                return []
            self._leading = False
        text = self._newlines + text
        body = text.rstrip("\n")
        self._newlines = text[len(body) :]
        return [ReasoningDelta(body)] if body else []

    def finish(self) -> list[Delta]:
        held, self._held = self._held, ""
        if self._state == _START:  # only whitespace or a partial ``<think>``: it is text
            self._state = _CONTENT
            return [*self._inner.feed(held), *self._inner.finish()] if held else []
        if self._state == _REASONING:
            self._stats["reasoning.unclosed"] += 1
            return [*self._reasoning(held), *self._inner.finish()]
        return self._inner.finish()


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


class ThinkFormat(PlainText):
    """The registry's ``think``: a ``ThinkParser`` in front of the route's tool parser. A
    format with other tags is a subclass naming a ``ThinkParser`` subclass with them."""

    parser: ClassVar[type[ThinkParser]] = ThinkParser
    markers: ClassVar[tuple[str, ...]] = (ThinkParser.OPEN, ThinkParser.CLOSE)

    def text(self, schemas: ToolSchemas) -> TextReasoning:
        # The template opens the reasoning itself (DeepSeek-R1: the prompt ends with ``<think>``)
        opened = self.tokenizer.shape.generation_prompt.rstrip().endswith(self.parser.OPEN)
        return self.parser(self.tool_parser(schemas), opened, self.stats)

    @classmethod
    def sample(cls, reasoning: str, answer: str, call: str, arguments: str) -> str:
        tags = cls.parser
        text = PlainText.sample("", answer, call, arguments)
        return f"{tags.OPEN}\n{reasoning}\n{tags.CLOSE}\n\n{text}"
