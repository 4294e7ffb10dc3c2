"""A ``tokens`` route's options, as its config names them (SPEC: TOK-1, CFG-1)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TokensOptions:
    api: str = "vllm"  # the token server (``servers.SERVERS``, TOK-2)
    model: str | None = None  # None: the client's model name
    template: str = "jinja"  # the renderer (``render.RENDERERS``): jinja | harmony (HARMONY-1)
    tool_parser: str = "hermes"  # ``tool_parsers.PARSERS`` (TOK-6)
    rerender: bool = False  # ``history = "rerender"`` (TOK-4)
    # ``reasoning.REASONING_PARSERS`` (REASON-1); None: the template's own (harmony's channels)
    reasoning_parser: str | None = None
    sglang_stream: str = "auto"  # auto | cumulative | incremental (TOK-32)
    llamacpp_stream: bool = False  # llama.cpp answers whole unless told to stream (TOK-44)
    params: dict[str, Any] = field(default_factory=dict)
    weights: str = ""  # the route's checkpoint tag, stored with each segment (EXPORT-4)
    training_fields: bool = False  # every create gets TOK-60's fields (TOK-61)
