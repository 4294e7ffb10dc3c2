"""HTTP routes of the Conversations API (SPEC §19: CONV-1..CONV-4, CONV-9, CONV-10).

Every route names a conversation and checks its owner first (OWN-2): another key's
conversation is answered exactly as an unknown id, 404 ``conversation_not_found``. The
records are the store's (``engine/store/conversations.py``); a create that names a
conversation runs through ``/v1/responses`` and the one loader (CONV-5, CONV-6).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from engine.conversation.requests import check_metadata
from engine.server.transport import identity
from engine.server.transport.bodies import read_body
from engine.server.transport.http import PageQuery, json_response, page
from engine.server.transport.keys import ENGINE
from engine.store import StoreError
from engine.store.conversations import (
    MAX_ITEMS_PER_REQUEST,
    ConversationFull,
    ConversationHead,
    ConversationLocked,
    Conversations,
    Opened,
)
from engine.store.failures import wire_error
from protocol.conversations import (
    AddItems,
    Conversation,
    ConversationDeleted,
    CreateConversation,
    UpdateConversation,
    decode,
    items_of,
)
from protocol.errors import (
    InvalidRequest,
    NotFound,
    conversation_locked,
    conversation_not_found,
)
from protocol.items import InputItem

ID = "/v1/conversations/{conversation_id}"
ITEM = ID + "/items/{item_id}"


def register(app: web.Application) -> None:
    """The one place the conversation routes join the app (``create_app`` calls it)."""
    app.router.add_post("/v1/conversations", create_conversation)
    app.router.add_get(ID, retrieve_conversation)
    app.router.add_post(ID, update_conversation)
    app.router.add_delete(ID, delete_conversation)
    app.router.add_get(ID + "/items", list_items)
    app.router.add_post(ID + "/items", add_items)
    app.router.add_get(ITEM, retrieve_item)
    app.router.add_delete(ITEM, delete_item)


def full_error() -> InvalidRequest:
    return InvalidRequest(
        "conversation_too_large",
        "The conversation holds as many items as it may; start a new one.",
        "items",
    )


def conversation_object(head: ConversationHead) -> Conversation:
    return Conversation(id=head.id, created_at=head.created_at, metadata=head.metadata)


def _conversations(request: web.Request) -> Conversations:
    return Conversations(request.app[ENGINE].store)


def _metadata(raw: dict[str, Any] | None) -> dict[str, str]:
    check_metadata(raw)
    return {str(key): str(value) for key, value in (raw or {}).items()}


async def _guarded(call: Awaitable[Any]) -> Any:
    """A store fault as its wire error (STORE-8, STORE-9); a full conversation as a 400."""
    try:
        return await call
    except ConversationFull:
        raise full_error() from None
    except StoreError as exc:
        raise wire_error(exc) from None


async def _head(request: web.Request) -> ConversationHead:
    conversation_id = request.match_info["conversation_id"]
    owner = await identity.owner(request)
    found = _conversations(request).head(conversation_id, owner)
    head: ConversationHead | None = await _guarded(found)
    if head is None:
        raise conversation_not_found(conversation_id)
    return head


async def _locked(
    request: web.Request, write: Callable[[Conversations, Opened], Awaitable[Any]]
) -> Any:
    """Run one write under the conversation's lock (CONV-7); another key's is unknown."""
    conversation_id = request.match_info["conversation_id"]
    owner = await identity.owner(request)
    conversations = _conversations(request)
    try:
        opened = await _guarded(conversations.open(conversation_id, owner))
    except ConversationLocked:
        raise conversation_locked(conversation_id) from None
    if opened is None:
        raise conversation_not_found(conversation_id)
    try:
        return await _guarded(write(conversations, opened))
    finally:
        await _guarded(opened.lock.release())


async def create_conversation(request: web.Request) -> web.Response:
    """``POST /v1/conversations`` (CONV-1)."""
    params: CreateConversation = decode(CreateConversation, await read_body(request))
    metadata = _metadata(params.metadata)
    items = items_of(params.items, MAX_ITEMS_PER_REQUEST)
    owner = await identity.owner(request)
    head = await _guarded(_conversations(request).create(owner, metadata, items))
    return json_response(conversation_object(head))


async def retrieve_conversation(request: web.Request) -> web.Response:
    return json_response(conversation_object(await _head(request)))


async def update_conversation(request: web.Request) -> web.Response:
    """``POST /v1/conversations/{id}``: replaces its metadata (CONV-1)."""
    params: UpdateConversation = decode(UpdateConversation, await read_body(request))
    metadata = _metadata(params.metadata)

    async def write(conversations: Conversations, opened: Opened) -> ConversationHead:
        return await conversations.update(opened, metadata)

    return json_response(conversation_object(await _locked(request, write)))


async def delete_conversation(request: web.Request) -> web.Response:
    """``DELETE /v1/conversations/{id}`` (CONV-4): its items go with it; the responses made
    on it stay, each its own record."""

    async def write(conversations: Conversations, opened: Opened) -> str:
        await conversations.delete(opened)
        return opened.head.id

    deleted = await _locked(request, write)
    return json_response(ConversationDeleted(id=deleted))


async def add_items(request: web.Request) -> web.Response:
    """``POST /v1/conversations/{id}/items`` (CONV-3): at most 20 at a time, as one segment."""
    params: AddItems = decode(AddItems, await read_body(request))
    items = items_of(params.items, MAX_ITEMS_PER_REQUEST)
    if not items:
        raise InvalidRequest("invalid_value", "items must hold at least one item.", "items")

    async def write(conversations: Conversations, opened: Opened) -> list[InputItem]:
        conversations.check_room(opened, len(items))
        return await conversations.append(opened, items)

    added: list[InputItem] = await _locked(request, write)
    return json_response(_page(added, has_more=False))


async def list_items(request: web.Request) -> web.Response:
    """``GET /v1/conversations/{id}/items`` (CONV-3): ``after``, ``limit`` (1..100, 20),
    ``order`` (``asc`` or ``desc``, the default); ``include`` is accepted (CONV-10). Ids are
    strings, as the SDK's ``ConversationItemList`` requires: "" on an empty page."""
    asked = PageQuery.of(request.query)  # a bad query is 400 before the lookup (CONV-3)
    head = await _head(request)
    items = await _guarded(_conversations(request).items(head))
    return json_response(page(items, asked, ""))


async def retrieve_item(request: web.Request) -> web.Response:
    head = await _head(request)
    item_id = request.match_info["item_id"]
    for item in await _guarded(_conversations(request).items(head)):
        if getattr(item, "id", None) == item_id:
            return json_response(item)
    raise _item_not_found(item_id)


async def delete_item(request: web.Request) -> web.Response:
    """``DELETE …/items/{item_id}``: answers the conversation (as OpenAI's does, CONV-3)."""
    item_id = request.match_info["item_id"]

    async def write(conversations: Conversations, opened: Opened) -> ConversationHead:
        if not await conversations.delete_item(opened, item_id):
            raise _item_not_found(item_id)
        return opened.head

    return json_response(conversation_object(await _locked(request, write)))


def _item_not_found(item_id: str) -> NotFound:
    return NotFound("item_not_found", f"Item with id '{item_id}' not found.", None)


def _page(items: list[InputItem], *, has_more: bool) -> dict[str, Any]:
    ids = [getattr(item, "id", None) for item in items]
    return {
        "object": "list",
        "data": items,
        # Strings, as the SDK's ``ConversationItemList`` requires; "" on an empty page (CONV-3).
        "first_id": ids[0] if ids else "",
        "last_id": ids[-1] if ids else "",
        "has_more": has_more,
    }
