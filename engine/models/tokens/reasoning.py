"""Sampled ids -> reasoning, message text and calls (SPEC: REASON-1..REASON-5, TOK-5, TOK-6).

A route's ``reasoning_parser`` names a ``ReasoningParser`` in ``REASONING_PARSERS``; a route
that names none reads with its template's own (``Renderer.reasoning``: harmony's channels) or,
for a chat template, with ``PlainText``: the tool parser alone. A format is one module with
one subclass and one line in the registry: ``think.py`` (``<think>…</think>``, Qwen3 and
DeepSeek-R1) and ``harmony.py`` (gpt-oss's channels).

A text format's parser sits between the incremental decoder and the tool parser
(``TextReasoning``); ``TextReader`` decodes the sampled ids and counts those read inside
reasoning (REASON-3).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from typing import Any, ClassVar, Protocol

from engine.models.base import Delta
from engine.models.tokens.jinja import JinjaRenderer
from engine.models.tokens.registry import Registry
from engine.models.tokens.render import Renderer
from engine.models.tokens.tool_parsers import PARSERS, ToolParser, ToolSchemas


class IdDecoder(Protocol):
    def step(self, token_id: int) -> str: ...


class AnswerReader(Protocol):
    """One generation's sampled ids -> deltas (text formats here, harmony in ``harmony.py``)."""

    reasoning_tokens: int  # sampled ids read inside reasoning (REASON-3)
    ended_in_call: bool  # the last thing read was a function call

    @property
    def calls(self) -> int:
        """Function calls produced so far."""
        ...

    @property
    def malformed(self) -> int:
        """Calls that could not be read and stayed text (PARSE-3)."""
        ...

    def feed(self, ids: list[int]) -> list[Delta]: ...

    def finish(self) -> list[Delta]: ...


class TextReasoning(ABC):
    """A text format's reasoning parser, in front of the tool parser for one generation."""

    def __init__(self, inner: ToolParser) -> None:
        self._inner = inner

    @property
    def calls(self) -> int:
        return self._inner.calls

    @property
    def malformed(self) -> int:
        return self._inner.malformed

    @property
    @abstractmethod
    def in_reasoning(self) -> bool:
        """The text read so far ends inside reasoning."""

    @abstractmethod
    def feed(self, text: str) -> list[Delta]: ...

    @abstractmethod
    def finish(self) -> list[Delta]: ...


class TextReader:
    """Sampled ids -> text (the incremental decoder) -> the parser's deltas. With a reasoning
    parser each id is read on its own, so the ids read inside reasoning can be counted."""

    def __init__(self, decoder: IdDecoder, parser: ToolParser | TextReasoning) -> None:
        self._decoder = decoder
        self._parser = parser
        self.reasoning_tokens = 0
        self.ended_in_call = False  # the templates' close does not depend on it

    @property
    def calls(self) -> int:
        return self._parser.calls

    @property
    def malformed(self) -> int:
        return self._parser.malformed

    def feed(self, ids: list[int]) -> list[Delta]:
        parser, step = self._parser, self._decoder.step
        if not isinstance(parser, TextReasoning):
            text = "".join(step(token) for token in ids)
            return parser.feed(text) if text else []
        out: list[Delta] = []
        for token in ids:
            inside = parser.in_reasoning
            piece = step(token)
            if piece:
                out.extend(parser.feed(piece))
            if inside or parser.in_reasoning:
                self.reasoning_tokens += 1
        return out

    def finish(self) -> list[Delta]:
        return self._parser.finish()


class ReasoningParser(ABC):
    """A route's way of reading what its model samples, built once per route: ``reader`` makes
    the reader of one generation."""

    template: ClassVar[str] = "jinja"  # the renderer it reads after (HARMONY-1)

    def __init__(self, renderer: Renderer[Any], tool_parser: str, stats: Counter[str]) -> None:
        self.renderer = renderer
        self.tool_parser = PARSERS[tool_parser]
        self.stats = stats
        self.call_parser = tool_parser  # what reads its calls, as malformed calls are counted

    @abstractmethod
    def reader(self, schemas: ToolSchemas) -> AnswerReader:
        """The reader of one generation (``schemas``: the request's function tools)."""

    @classmethod
    @abstractmethod
    def sample(cls, reasoning: str, answer: str, call: str, arguments: str) -> str:
        """A generation in this format: ``reasoning``, then ``answer`` and a call of ``call``
        with ``arguments`` (a JSON object) in the hermes tool format where the format leaves
        calls to the tool parser; what the reader benchmark reads (``bench/reader_cpu.py``)."""


class PlainText(ReasoningParser):
    """No reasoning: the decoded text goes to the tool parser alone. ``markers`` are the texts
    a format needs to see even when the tokenizer marks them special (TOK-30)."""

    markers: ClassVar[tuple[str, ...]] = ()

    def __init__(self, renderer: Renderer[Any], tool_parser: str, stats: Counter[str]) -> None:
        super().__init__(renderer, tool_parser, stats)
        assert isinstance(renderer, JinjaRenderer)
        self.tokenizer = renderer.tokenizer
        # Special tokens hidden from text: all but the markers the parsers read (TOK-30); once.
        markers = [*self.tool_parser({}).markers, *self.markers]
        self.hidden_ids = self.tokenizer.hidden_ids(markers)

    def reader(self, schemas: ToolSchemas) -> AnswerReader:
        return TextReader(self.tokenizer.decoder(self.hidden_ids), self.text(schemas))

    def text(self, schemas: ToolSchemas) -> ToolParser | TextReasoning:
        """What reads the decoded text of one generation."""
        return self.tool_parser(schemas)

    @classmethod
    def sample(cls, reasoning: str, answer: str, call: str, arguments: str) -> str:
        return (
            f'{answer}\n<tool_call>\n{{"name": "{call}", "arguments": {arguments}}}\n</tool_call>'
        )


# the route's ``reasoning_parser`` -> its format (REASON-1, HARMONY-3)
REASONING_PARSERS: Registry[ReasoningParser] = Registry(
    ReasoningParser,
    {
        "think": "engine.models.tokens.think:ThinkFormat",
        "harmony": "engine.models.tokens.harmony:HarmonyFormat",
    },
)


def reasoning_parser(
    name: str | None, renderer: Renderer[Any], tool_parser: str, stats: Counter[str]
) -> ReasoningParser:
    """The route's reasoning parser: the one it names, else its template's own, else none."""
    name = name or renderer.reasoning
    kind = REASONING_PARSERS[name] if name is not None else PlainText
    return kind(renderer, tool_parser, stats)
