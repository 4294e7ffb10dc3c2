"""How stored input items are listed (STORE-3)."""

from __future__ import annotations

import msgspec

from protocol.items import (
    Compaction,
    CustomToolCall,
    CustomToolCallOutput,
    FunctionCall,
    FunctionCallOutput,
    InputItem,
    InputText,
    Message,
    OutputText,
    without_tokens,
)
from protocol.stream import new_id


def listing_form(item: InputItem) -> InputItem:
    """How a stored input item is listed (STORE-3): with an id, a status and, for messages, a
    list of content parts, as ``GET /v1/responses/{id}/input_items`` clients expect; without
    the training fields a client carried back (TOK-62: the model call's ids, stored once with
    the response that produced them)."""
    item = without_tokens(item)
    if isinstance(item, Message):
        content = item.content
        if isinstance(content, str):
            part = OutputText(text=content) if item.role == "assistant" else InputText(text=content)
            content = [part]
        return msgspec.structs.replace(
            item, id=item.id or new_id("msg"), status=item.status or "completed", content=content
        )
    if isinstance(item, FunctionCall):
        return msgspec.structs.replace(
            item, id=item.id or new_id("fc"), status=item.status or "completed"
        )
    if isinstance(item, FunctionCallOutput):
        return msgspec.structs.replace(
            item, id=item.id or new_id("fco"), status=item.status or "completed"
        )
    if isinstance(item, CustomToolCall):
        return msgspec.structs.replace(item, id=item.id or new_id("ctc"))
    if isinstance(item, CustomToolCallOutput):
        return msgspec.structs.replace(item, id=item.id or new_id("ctco"))
    if isinstance(item, Compaction):
        return msgspec.structs.replace(item, id=item.id or new_id("cmp"))
    return item
