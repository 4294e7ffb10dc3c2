"""Response store behind an interface (SPEC: STORE-1..STORE-3). In memory for now.

Only ``store=true`` responses are written here; ``store=false`` state lives solely in a
connection's cache and never leaves memory of that connection. The store is bounded (LRU).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

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
)
from protocol.response import Response
from protocol.stream import new_id


@dataclass(slots=True)
class StoredResponse:
    response: Response
    input_items: list[InputItem]  # this request's own input items (ids assigned)
    context: list[InputItem]  # the whole conversation after this response, for continuation


class ResponseStore(Protocol):
    def put(self, record: StoredResponse) -> None: ...
    def get(self, response_id: str) -> StoredResponse | None: ...
    def delete(self, response_id: str) -> bool: ...


class InMemoryStore:
    """A bounded LRU map of stored responses."""

    def __init__(self, max_entries: int = 10_000) -> None:
        self.max_entries = max_entries
        self._data: OrderedDict[str, StoredResponse] = OrderedDict()

    def put(self, record: StoredResponse) -> None:
        self._data[record.response.id] = record
        self._data.move_to_end(record.response.id)
        while len(self._data) > self.max_entries:
            self._data.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        return self._data.get(response_id)

    def delete(self, response_id: str) -> bool:
        return self._data.pop(response_id, None) is not None

    def __len__(self) -> int:
        return len(self._data)


def listing_form(item: InputItem) -> InputItem:
    """How a stored input item is listed (STORE-3): with an id, a status and, for messages, a
    list of content parts, as ``GET /v1/responses/{id}/input_items`` clients expect."""
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
