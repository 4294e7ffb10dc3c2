"""The Conversations API's bodies and objects (SPEC §19: CONV-1..CONV-4), as the openai SDK's
``openai.types.conversations`` types send and parse them. Unknown fields are accepted and
ignored (LEN-1)."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from protocol.codec import parse_input
from protocol.errors import InvalidRequest, validation_error
from protocol.items import InputItem

MAX_METADATA_PAIRS = 16


class CreateConversation(msgspec.Struct, kw_only=True):
    """``POST /v1/conversations``."""

    items: list[Any] | None = None
    metadata: dict[str, Any] | None = None


class UpdateConversation(msgspec.Struct, kw_only=True):
    """``POST /v1/conversations/{id}``: ``metadata`` is required (it may be null: cleared)."""

    metadata: dict[str, Any] | None


class AddItems(msgspec.Struct, kw_only=True):
    """``POST /v1/conversations/{id}/items``."""

    items: list[Any]


class Conversation(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["conversation"] = "conversation"
    created_at: int
    metadata: dict[str, str]


class ConversationDeleted(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["conversation.deleted"] = "conversation.deleted"
    deleted: bool = True


_DECODERS: dict[type[Any], msgspec.json.Decoder[Any]] = {
    kind: msgspec.json.Decoder(kind) for kind in (CreateConversation, UpdateConversation, AddItems)
}


def decode(kind: type[Any], body: bytes) -> Any:
    """One of the bodies above, or the 400 that says which field is wrong (CODEC-3)."""
    try:
        return _DECODERS[kind].decode(body)
    except msgspec.ValidationError as exc:
        raise validation_error(exc) from None
    except (msgspec.DecodeError, RecursionError):
        raise InvalidRequest("invalid_json", "The request body is not valid JSON.", None) from None


def items_of(raw: list[Any] | None, limit: int) -> list[InputItem]:
    """The items of a create or items request, typed as ``input`` items are (ITEM-1), at most
    ``limit`` of them (CONV-9)."""
    if not raw:
        return []
    if len(raw) > limit:
        raise InvalidRequest(
            "too_many_items", f"At most {limit} items may be added at a time.", "items"
        )
    return parse_input(raw, "items")
