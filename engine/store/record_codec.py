"""Stored records <-> bytes (JSON: the Response keeps tools as raw JSON, TOOL-1; STORE-4, STORE-9).

Input items include ``OpaqueItem``s (ITEM-7), which msgspec cannot decode as part of a typed
union. So a record is decoded into a mirror struct whose item lists are plain values (built from
the record's own fields, so the two never drift apart), and the items are then typed the way
``parse_input`` types them: opaque kinds kept as sent, the rest converted in one call.
"""

from __future__ import annotations

from typing import Any

import msgspec

from protocol.items import OPAQUE_ITEMS, InputItem, OpaqueItem, TypedItem

ITEM_FIELDS = ("input_items", "context")


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, OpaqueItem):
        return obj.data
    raise NotImplementedError(f"cannot store {type(obj).__name__}")


def mirror(record_type: type[msgspec.Struct]) -> type[msgspec.Struct]:
    """``record_type`` with its item lists as plain values."""
    fields: list[Any] = []
    for info in msgspec.structs.fields(record_type):
        kind: Any = list[Any] if info.name in ITEM_FIELDS else info.type
        if info.default is not msgspec.NODEFAULT:
            fields.append((info.name, kind, info.default))
        elif info.default_factory is not msgspec.NODEFAULT:
            fields.append((info.name, kind, msgspec.field(default_factory=info.default_factory)))
        else:
            fields.append((info.name, kind))
    return msgspec.defstruct(f"Stored{record_type.__name__}", fields, kw_only=True)


def typed_items(raw: list[Any]) -> list[InputItem]:
    """Raises ``msgspec.ValidationError`` for an item that is neither kind."""
    if not any(isinstance(e, dict) and e.get("type") in OPAQUE_ITEMS for e in raw):
        return list(msgspec.convert(raw, list[TypedItem]))
    return [
        OpaqueItem(e) if e.get("type") in OPAQUE_ITEMS else msgspec.convert(e, TypedItem)
        for e in raw
    ]


class RecordCodec:
    """Built once per record type."""

    def __init__(self, record_type: type[msgspec.Struct]) -> None:
        self.record_type = record_type
        self._encoder = msgspec.json.Encoder(enc_hook=_enc_hook)
        self._decoder = msgspec.json.Decoder(mirror(record_type))
        self._names = [f.name for f in msgspec.structs.fields(record_type)]

    def encode(self, record: msgspec.Struct) -> bytes:
        return self._encoder.encode(record)

    def decode(self, blob: bytes | memoryview) -> Any:
        """Raises ``msgspec.DecodeError`` / ``msgspec.ValidationError`` for a bad blob."""
        stored = self._decoder.decode(blob)
        values = {name: getattr(stored, name) for name in self._names}
        for name in ITEM_FIELDS:
            values[name] = typed_items(values[name])
        return self.record_type(**values)


_ITEMS_ENCODER = msgspec.json.Encoder(enc_hook=_enc_hook)
_ITEMS_DECODER = msgspec.json.Decoder(list[Any])


def encode_items(items: list[InputItem]) -> bytes:
    """A conversation's items as a JSON array, the way records hold them (a hand-over, PARK-21)."""
    return _ITEMS_ENCODER.encode(items)


def decode_items(blob: bytes) -> list[InputItem]:
    """Raises ``msgspec.DecodeError`` / ``msgspec.ValidationError`` for a bad blob."""
    return typed_items(_ITEMS_DECODER.decode(blob))
