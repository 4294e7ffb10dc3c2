"""Chat template: items -> token ids. Each item renders independently, so a rollout appends the
tokens of new items without touching (or re-encoding) the history (SPEC: PIPE-3)."""

from __future__ import annotations

import hashlib

from engine.tokens import encode
from protocol.items import (
    ContentPart,
    FunctionCall,
    FunctionCallOutput,
    InputFile,
    InputImage,
    InputItem,
    Message,
    Reasoning,
    text_of,
)
from protocol.response import Tool

IMAGE_TOKENS = 85  # flat per-image budget, like a low-detail image


def _placeholder(part: ContentPart) -> str | None:
    """What the template shows for a part without text: an image costs a flat token budget."""
    if isinstance(part, InputImage):
        ref = part.image_url or part.file_id or ""
        digest = hashlib.sha1(ref.encode(), usedforsecurity=False).hexdigest()[:12]
        return f"<image {digest}>" + " ." * IMAGE_TOKENS
    if isinstance(part, InputFile):
        return f"<file {part.filename or part.file_id or 'inline'}>"
    return None


def item_text(item: InputItem) -> str:
    """The template text of one item."""
    if isinstance(item, Message):
        return f"<|im_start|>{item.role}\n{text_of(item.content, _placeholder)}<|im_end|>\n"
    if isinstance(item, FunctionCall):
        return f"<|im_start|>assistant to={item.name}\n{item.arguments}<|im_end|>\n"
    if isinstance(item, FunctionCallOutput):
        body = text_of(item.output, _placeholder)
        return f"<|im_start|>tool {item.call_id}\n{body}<|im_end|>\n"
    if isinstance(item, Reasoning):
        summary = "\n".join(s.text for s in item.summary)
        return f"<|im_start|>reasoning\n{summary}<|im_end|>\n"
    # Item references are resolved before rendering (ITEM-4), so none reaches this point.
    raise TypeError(f"unrenderable item {type(item).__name__}")


def render_item(item: InputItem) -> list[int]:
    return encode(item_text(item))


def header_text(instructions: str | None, tools: list[Tool]) -> str:
    lines = []
    if instructions:
        lines.append(f"<|im_start|>system\n{instructions}<|im_end|>\n")
    for tool in tools:
        params = tool.parameters or {}
        lines.append(f"<|im_start|>tool_def {tool.name}\n{tool.description or ''}\n{params}\n")
    return "".join(lines)


def render_header(instructions: str | None, tools: list[Tool]) -> list[int]:
    return encode(header_text(instructions, tools))
