"""Input and output items and their content parts (SPEC: ITEM-1..ITEM-6).

The same structs serve as input (what clients send, including replayed output) and output (what
the model produced). Optional fields default to ``None`` and are omitted on the wire when unset,
so a replayed item is echoed the way the client sent it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import msgspec

Role = Literal["user", "assistant", "system", "developer"]
ItemStatus = Literal["in_progress", "completed", "incomplete"]


class InputText(msgspec.Struct, tag="input_text", tag_field="type"):
    text: str


class OutputText(msgspec.Struct, tag="output_text", tag_field="type"):
    text: str
    annotations: list[Any] = msgspec.field(default_factory=list)
    logprobs: list[Any] = msgspec.field(default_factory=list)


class Refusal(msgspec.Struct, tag="refusal", tag_field="type"):
    refusal: str


class InputImage(msgspec.Struct, tag="input_image", tag_field="type", omit_defaults=True):
    detail: str = "auto"
    image_url: str | None = None
    file_id: str | None = None


class InputFile(msgspec.Struct, tag="input_file", tag_field="type", omit_defaults=True):
    file_id: str | None = None
    file_data: str | None = None
    file_url: str | None = None
    filename: str | None = None


ContentPart = InputText | OutputText | Refusal | InputImage | InputFile


class Message(msgspec.Struct, tag="message", tag_field="type", omit_defaults=True, kw_only=True):
    role: Role
    content: str | list[ContentPart]
    id: str | None = None
    status: ItemStatus | None = None
    phase: Literal["commentary", "final_answer"] | None = None


class FunctionCall(
    msgspec.Struct, tag="function_call", tag_field="type", omit_defaults=True, kw_only=True
):
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: ItemStatus | None = None
    namespace: str | None = None


class FunctionCallOutput(
    msgspec.Struct, tag="function_call_output", tag_field="type", omit_defaults=True, kw_only=True
):
    call_id: str
    output: str | list[ContentPart]
    id: str | None = None
    status: ItemStatus | None = None


class ItemReference(msgspec.Struct, tag="item_reference", tag_field="type"):
    id: str


class SummaryText(msgspec.Struct, tag="summary_text", tag_field="type"):
    text: str


class ReasoningText(msgspec.Struct, tag="reasoning_text", tag_field="type"):
    text: str


class Reasoning(
    msgspec.Struct, tag="reasoning", tag_field="type", omit_defaults=True, kw_only=True
):
    """Passed through untouched (ITEM-5): we never generate reasoning, but clients replay it."""

    id: str
    summary: list[SummaryText] = msgspec.field(default_factory=list)
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None
    status: ItemStatus | None = None


InputItem = Message | FunctionCall | FunctionCallOutput | ItemReference | Reasoning
OutputItem = Message | FunctionCall


def part_text(part: ContentPart) -> str | None:
    """The readable text of one content part; None for images and files."""
    if isinstance(part, InputText | OutputText):
        return part.text
    if isinstance(part, Refusal):
        return part.refusal
    return None


def text_of(
    content: str | list[ContentPart],
    placeholder: Callable[[ContentPart], str | None] | None = None,
) -> str:
    """All readable text of a message or tool-output content, joined in order.

    A part without text (an image, a file) is skipped, or stands as ``placeholder(part)`` when
    one is given (the chat template marks where an image or a file was)."""
    if isinstance(content, str):
        return content
    out: list[str] = []
    for part in content:
        text = part_text(part)
        if text is None and placeholder is not None:
            text = placeholder(part)
        if text is not None:
            out.append(text)
    return "\n".join(out)


def item_texts(item: InputItem) -> list[str]:
    """Every text the model will read from one item (used by the safety scan)."""
    if isinstance(item, Message):
        return [text_of(item.content)]
    if isinstance(item, FunctionCall):
        return [item.arguments]
    if isinstance(item, FunctionCallOutput):
        return [text_of(item.output)]
    if isinstance(item, Reasoning):
        return [s.text for s in item.summary]
    return []
