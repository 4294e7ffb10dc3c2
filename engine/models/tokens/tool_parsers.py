"""Sampled text -> message text and function calls (SPEC: TOK-6, PARSE-1..PARSE-7).

A parser is fed the decoded text as it streams and returns deltas; ``finish`` flushes what it
holds. Parsers are registered by name in ``PARSERS`` (the route's ``tool_parser``): a factory
called once per generation with the request's function tools (name -> ``parameters`` schema),
so another format is one module and one line here. ``markers`` are the texts the parser needs
to see even when the tokenizer marks them special (TOK-30). The formats live in ``parsers/``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from engine.models.base import Delta
from engine.models.tokens.parsers.common import ToolSchemas
from engine.models.tokens.parsers.hermes import HermesParser
from engine.models.tokens.parsers.llama3_json import Llama3JsonParser
from engine.models.tokens.parsers.mistral import MistralParser
from engine.models.tokens.parsers.qwen3_coder import Qwen3CoderParser

__all__ = ["PARSERS", "HermesParser", "ToolParser", "ToolSchemas"]


class ToolParser(Protocol):
    @property
    def markers(self) -> tuple[str, ...]:
        """Texts that must reach ``feed`` even when the tokenizer marks them special (TOK-30)."""
        ...

    @property
    def calls(self) -> int:
        """Function calls produced so far."""
        ...

    @property
    def malformed(self) -> int:
        """Calls that could not be read and stayed text (PARSE-3)."""
        ...

    def feed(self, text: str) -> list[Delta]: ...

    def finish(self) -> list[Delta]: ...


# name (the route's ``tool_parser``) -> a factory of one parser per generation
PARSERS: dict[str, Callable[[ToolSchemas], ToolParser]] = {
    "hermes": HermesParser,
    "qwen3_coder": Qwen3CoderParser,
    "llama3_json": Llama3JsonParser,
    "mistral": MistralParser,
}
