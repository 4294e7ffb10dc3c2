"""Sampled text -> message text and function calls (SPEC: TOK-6, PARSE-1..PARSE-7).

A parser is fed the decoded text as it streams and returns deltas; ``finish`` flushes what it
holds. Parsers are registered by name in ``PARSERS`` (the route's ``tool_parser``): a
``ToolParser`` subclass made once per generation with the request's function tools (name ->
``parameters`` schema), so another format is one module in ``parsers/`` and one line here.
``markers`` are the texts the parser needs to see even when the tokenizer marks them special
(TOK-30).
"""

from __future__ import annotations

from engine.models.tokens.parsers.common import ToolParser, ToolSchemas
from engine.models.tokens.registry import Registry

__all__ = ["PARSERS", "ToolParser", "ToolSchemas"]

# name (the route's ``tool_parser``) -> its parser, one per generation
PARSERS: Registry[ToolParser] = Registry(
    ToolParser,
    {
        "hermes": "engine.models.tokens.parsers.hermes:HermesParser",
        "qwen3_coder": "engine.models.tokens.parsers.qwen3_coder:Qwen3CoderParser",
        "llama3_json": "engine.models.tokens.parsers.llama3_json:Llama3JsonParser",
        "mistral": "engine.models.tokens.parsers.mistral:MistralParser",
    },
)
