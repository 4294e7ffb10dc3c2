"""Store failures as wire errors (STORE-8, STORE-9): one mapping, used by every caller."""

from __future__ import annotations

from engine.store.base import RecordCorrupt, RecordTooLarge, StoreError
from protocol.errors import (
    ProtocolError,
    store_record_corrupt,
    store_record_too_large,
    store_unavailable,
)


def wire_error(exc: StoreError, param: str | None = None) -> ProtocolError:
    if isinstance(exc, RecordTooLarge):
        return store_record_too_large(exc.size, exc.limit)
    if isinstance(exc, RecordCorrupt):
        return store_record_corrupt(exc.response_id, param)
    return store_unavailable()
