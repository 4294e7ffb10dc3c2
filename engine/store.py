"""Response store behind an interface (SPEC: STORE-1..STORE-3). In memory for now.

Only ``store=true`` responses are written here; ``store=false`` state lives solely in a
connection's cache and never leaves memory of that connection. The store is bounded (LRU).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

from protocol.items import InputItem
from protocol.response import Response


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
