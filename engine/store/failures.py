"""Store failures as wire errors (STORE-8, STORE-9): one mapping, used by every caller."""

from __future__ import annotations

from engine.store.records import RecordCorrupt, RecordTooLarge, StoreError
from protocol.errors import (
    ProtocolError,
    store_record_corrupt,
    store_record_too_large,
    store_unavailable,
    store_write_lost,
)


def wire_error(exc: StoreError, param: str | None = None) -> ProtocolError:
    if isinstance(exc, RecordTooLarge):
        return store_record_too_large(exc.size, exc.limit)
    if isinstance(exc, RecordCorrupt):
        return store_record_corrupt(exc.response_id, param)
    return store_unavailable()


def terminal_write_error(exc: StoreError) -> ProtocolError:
    """A terminal write's failure, after the model ran: ``store_unavailable`` as a 500, since a
    503 says the request did no work and may be run again (RETRY-1, RETRY-2)."""
    error = wire_error(exc)
    return store_write_lost() if error.status == 503 else error
