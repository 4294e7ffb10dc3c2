"""The one conversation loader (SPEC: OWN-4, COMPAT-2..COMPAT-5, COMPAT-7, COMPAT-10, PARK-3,
HYD-1).

Every request that names a ``previous_response_id`` (a create on either transport, ``/compact``,
``/input_tokens``) gets its conversation from ``load_conversation`` (``load_stored`` for the
routes that read a stored response whole, such as ``/tokens``) and nowhere else: this module is
the only caller of ``store.hydrate`` (``tests/test_floors.py`` checks that), and the ``owner``
argument has no default, so no path can forget the owner check (OWN-2). Another key's
response is answered exactly as an unknown id. A create that names nothing may still continue
a context: a resent history (COMPAT-7), matched here against the owner's own responses only.

The places a create's conversation can come from are one table, ``PATHS`` (one row per
``LoadPath``), cheapest first. ``load_conversation`` picks the path; the caller runs it
(``connection/compat.py``).
"""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Callable
from dataclasses import dataclass

from engine.connection.lane import CacheEntry, Lane
from engine.conversation.pipeline import TurnLog
from engine.conversation.resend import Rolling, prefix_digests
from engine.conversation.sealed import is_sealed
from engine.core import Engine
from engine.models.base import Backend
from engine.retained.handover import Handed
from engine.retained.hydration import CachedContext, HeaderKey
from engine.retained.parking import Parked
from engine.rollout.coroutine import Rollout
from engine.rollout.turn import Mode
from engine.store import Hydrated, MemoryStore, StoreError
from engine.store.conversations import ConversationFull, ConversationLocked, Conversations, Opened
from engine.store.failures import wire_error
from engine.store.framing import OwnerFilter
from protocol.errors import (
    InvalidRequest,
    ProtocolError,
    conversation_locked,
    conversation_not_found,
    previous_response_not_found,
    response_not_found,
)
from protocol.items import InputItem, Reasoning, carries_tokens


class LoadPath(enum.Enum):
    """Where a create's conversation comes from (COMPAT-*)."""

    FAST = "fast"
    CACHE = "cache"
    PARKED = "parked"
    HYDRATED = "hydrated"
    STORE = "store"
    HANDED = "handed"
    CONVERSATION = "conversation"
    RESENT = "resent"
    STATELESS = "stateless"


@dataclass(frozen=True)
class LoadPathInfo:
    rule: str  # the SPEC rule that defines it
    serves: str  # what a continuation on it is served from


PATHS: dict[LoadPath, LoadPathInfo] = {
    LoadPath.FAST: LoadPathInfo(
        "COMPAT-2", "the rollout suspended at the create's lane's latest response: resumed"
    ),
    LoadPath.CACHE: LoadPathInfo(
        "COMPAT-3", "a lane's cached latest context, forked (from another lane: CACHE-4)"
    ),
    LoadPath.PARKED: LoadPathInfo(
        "PARK-3", "a rollout parked by a closed socket or an HTTP chain (PARK-4), same owner"
    ),
    LoadPath.HYDRATED: LoadPathInfo("HYD-1", "a recent stored response's context in this process"),
    LoadPath.STORE: LoadPathInfo(
        "COMPAT-4",
        "the store: hydrated, full pre-inference (a resend another node answered, COMPAT-10)",
    ),
    LoadPath.HANDED: LoadPathInfo(
        "PARK-21", "a rollout parked on another node: its items, handed over"
    ),
    LoadPath.CONVERSATION: LoadPathInfo(
        "CONV-6", "a conversation no stored response stands for: its items, full pre-inference"
    ),
    LoadPath.RESENT: LoadPathInfo(
        "COMPAT-7",
        "a recent response of the same owner whose full item list the input begins with: its "
        "context, forked; pre-inference over the rest",
    ),
    LoadPath.STATELESS: LoadPathInfo("COMPAT-5", "nothing: full pre-inference over the input"),
}


@dataclass(frozen=True)
class Found:
    """A picked path and what it runs from. Exactly the fields of its path are set."""

    path: LoadPath
    lane: Lane | None = None  # FAST, CACHE: the lane holding ``entry``
    entry: CacheEntry | None = None  # FAST, CACHE
    live: Rollout | None = None  # FAST, PARKED: the suspended rollout a continuation resumes
    parked: Parked | None = None  # PARKED: claimed, so the caller now owns its task
    cached: CachedContext | None = None  # HYDRATED, RESENT
    # RESENT: how many of the input's first items ``cached`` holds (COMPAT-7); STORE reached
    # by a resend on another node: how many ``stored`` holds (COMPAT-10)
    resent: int = 0
    stored: Hydrated | None = None  # STORE
    handed: Handed | None = None  # HANDED: the context another node handed over
    # A create on a conversation (CONV-6): its items the context does not hold yet, which go
    # before the input (any path: CONVERSATION has all of them), and its held lock (CONV-7).
    pending: list[InputItem] | None = None
    opened: Opened | None = None


@dataclass(frozen=True)
class Create:
    """What a create may be served from beyond the store: its connection's lane caches (one
    key per connection, OWN-3), the parked rollouts and the hydration cache of its owner. The
    fast path also needs the create to be resumable (COMPAT-2)."""

    lane: Lane
    cached: Callable[[str], tuple[Lane, CacheEntry] | None]  # the connection's lanes (CACHE-2)
    mode: Mode
    generate: bool  # a warmup never takes the fast path: it does not sample
    log: TurnLog  # the store path's ``hydrate`` time goes to the response's log (OBS-1)
    items: list[InputItem] | None = None  # a stateless create's input, a resend? (COMPAT-7)
    held: int = 0  # its first items, an earlier create's that carried no ids (COMPAT-7)
    header: HeaderKey | None = None  # its instructions and tools: equal lists, this one's first

    def resumable(self, entry: CacheEntry, backend: Backend) -> Rollout | None:
        return entry.resumable_by(backend, self.mode) if self.generate else None


async def load_conversation(
    engine: Engine,
    response_id: str | None,
    *,
    owner: str | None,
    backend: Backend,
    create: Create | None = None,
) -> Found:
    """Pick where the conversation before ``response_id`` comes from, for ``owner``.

    Without ``create`` (``/compact``, ``/input_tokens``) only the store is read: nothing is
    claimed, resumed or counted. Raises ``previous_response_not_found`` for an unknown id and
    for another owner's (OWN-2), ``previous_response_in_progress`` for a running background
    response (BG-7), and the store's wire errors (STORE-8, STORE-9)."""
    if response_id is None:
        if create is not None and create.items:
            found = await _resent(engine, create, owner, backend)
            if found is not None:
                return found
        return Found(LoadPath.STATELESS)
    if create is not None:
        found = await _from_memory(engine, response_id, owner, backend, create)
        if found is not None:
            return found
        engine.counters["create.cache_miss"] += 1
    start = time.perf_counter()
    try:
        stored = await engine.store.hydrate(response_id, owner)  # owner before decode (OWN-5)
    except StoreError as exc:
        raise wire_error(exc, "previous_response_id") from None
    if create is not None:
        create.log.add_time("hydrate", time.perf_counter() - start)  # OBS-1
    if stored is None and create is not None:  # parked on another node? (PARK-21)
        handed = await engine.handover.fetch(response_id, owner)  # checks the owner there
        if handed is not None:
            return Found(LoadPath.HANDED, handed=handed)
    if stored is None:  # unknown, or another key's (OWN-2): the same answer
        raise previous_response_not_found(response_id)
    if stored.record.response.status in ("queued", "in_progress"):  # background (BG-7)
        raise InvalidRequest(
            "previous_response_in_progress",
            f"Previous response with id '{response_id}' has not finished yet.",
            "previous_response_id",
        )
    return Found(LoadPath.STORE, stored=stored)


async def load_joined(
    engine: Engine,
    conversation_id: str,
    *,
    owner: str | None,
    backend: Backend,
    create: Create,
) -> Found:
    """A create naming a conversation (CONV-5..CONV-7): its lock, then the path of the stored
    response that stands for its first items (any path above, through ``load_conversation``),
    with the items after those as ``pending``; with no such response, ``LoadPath.CONVERSATION``
    and all of them. The caller releases ``opened.lock`` once the response has ended."""
    conversations = Conversations(engine.store)
    try:
        opened = await conversations.open(conversation_id, owner)
    except ConversationLocked:
        raise conversation_locked(conversation_id, "conversation") from None
    except StoreError as exc:
        raise wire_error(exc, "conversation") from None
    if opened is None:  # unknown, or another key's (OWN-2)
        raise conversation_not_found(conversation_id, "conversation")
    try:
        return await _joined(engine, conversations, opened, owner, backend, create)
    except BaseException:
        await opened.lock.release()
        raise


async def _joined(
    engine: Engine,
    conversations: Conversations,
    opened: Opened,
    owner: str | None,
    backend: Backend,
    create: Create,
) -> Found:
    head = opened.head
    try:
        conversations.check_room(opened, 1)  # CONV-9
    except ConversationFull:
        raise InvalidRequest(
            "conversation_too_large",
            "The conversation holds as many items as it may; start a new one.",
            "conversation",
        ) from None
    found: Found | None = None
    if head.response_id is not None:
        try:
            found = await load_conversation(
                engine, head.response_id, owner=owner, backend=backend, create=create
            )
        except InvalidRequest as exc:  # its response was deleted: render the items (CONV-6)
            if exc.code != "previous_response_not_found":
                raise
            head.response_id, head.covered = None, 0
    try:
        pending = await conversations.items(head, after=head.covered)
    except StoreError as exc:
        raise wire_error(exc, "conversation") from None
    if found is None:
        return Found(LoadPath.CONVERSATION, pending=pending, opened=opened)
    return dataclasses.replace(found, pending=pending, opened=opened)


async def load_stored(engine: Engine, response_id: str, *, owner: OwnerFilter) -> Hydrated:
    """A stored response's whole chain, for a route that names it (``GET …/tokens``, TOK-8):
    the owner is checked before any decode, and an unknown id or another owner's is 404
    ``response_not_found`` (OWN-2). The one other reader of chains besides the loader above."""
    try:
        stored = await engine.store.hydrate(response_id, owner)  # owner before decode (OWN-5)
    except StoreError as exc:
        raise wire_error(exc) from None
    if stored is None:
        raise response_not_found(response_id)
    return stored


async def _from_memory(
    engine: Engine, response_id: str, owner: str | None, backend: Backend, create: Create
) -> Found | None:
    """The in-memory paths, cheapest first (CACHE-2): the connection's lanes, then the parked
    rollouts, then the hydration cache; each checks its owner (OWN-2, OWN-3)."""
    on_lane = create.cached(response_id)
    if on_lane is not None:
        lane, entry = on_lane
        live = create.resumable(entry, backend) if lane is create.lane else None
        return Found(LoadPath.FAST if live is not None else LoadPath.CACHE, lane, entry, live)
    found = await claim_parked(engine, response_id, owner, backend, create)
    if found is not None:
        return found
    cached = engine.hydrated.get(response_id, owner, backend.supports)
    # A create that claimed the rollout parked behind it meanwhile moves that context on
    # (HYD-3): this one then takes the store path, as a second continuation does (PARK-3).
    if (
        cached is not None
        and await still_stored(engine, response_id)
        and engine.hydrated.holds(cached)
    ):
        return Found(LoadPath.HYDRATED, cached=cached)
    return None


async def claim_parked(
    engine: Engine, response_id: str, owner: str | None, backend: Backend, create: Create
) -> Found | None:
    """The rollout parked behind ``response_id`` for ``owner`` (a closed socket's, PARK-1, or
    an HTTP chain's, PARK-4), claimed: the caller now owns its task, and no other create gets
    it (PARK-3); ``live`` is set when this create may resume it (COMPAT-2). None when nothing
    of ``owner``'s is parked there (another owner's is nothing, OWN-2). A ``store: true``
    rollout whose response was deleted meanwhile is retired and the id is not found (HYD-5)."""
    parked = engine.parking.claim(response_id, owner)
    if parked is None:
        return None
    assert isinstance(parked.rollout, Rollout)  # the only kind a session parks
    rollout = parked.rollout
    if rollout.settings.store and not await still_stored(engine, response_id):
        engine.parking.release(parked)  # deleted meanwhile: it winds down, still owned
        raise previous_response_not_found(response_id)
    entry = CacheEntry(parked.response_id, rollout.ctx, rollout.backend, rollout)
    return Found(LoadPath.PARKED, live=create.resumable(entry, backend), parked=parked)


async def _resent(
    engine: Engine, create: Create, owner: str | None, backend: Backend
) -> Found | None:
    """A stateless create whose input begins with the full item list of a response ``owner``
    received recently, on the same route (COMPAT-7..COMPAT-9): the longest such list, found by
    its length and last item and confirmed item for item (nothing rendered, no item the
    engine holds encoded again), from the hydration cache, where every response's context
    is published. Nothing found, a stored response
    deleted meanwhile (HYD-5) or a store that cannot say: None, the stateless path. An input
    that carries training fields continues from them instead (TOK-62), and one whose items
    after the match hold sealed reasoning replays its runs (SEAL-4): both are exact where a
    continuation would render those items."""
    items, held = create.items or [], create.held
    hydrated = engine.hydrated
    if not hydrated.max_bytes:  # the cache is off (HYD-2): so are resends
        return None
    if any(map(carries_tokens, items[held:] if held else items)):  # the held carry none
        return None
    matched = hydrated.resent(owner, items, backend, create.header)
    if matched is None:  # not this node's: another node's, stored? (COMPAT-10)
        return await _shared_resent(engine, items, owner, backend)
    cached, length = matched
    if any(_sealed(item) for item in items[length:]):  # its runs replay exactly (SEAL-4)
        return None
    if cached.stored:
        try:
            if not await still_stored(engine, cached.response_id):
                return None
        except ProtocolError:  # the store is down: render the input instead
            return None
        if len(cached.ctx.items) != cached.length:  # moved on meanwhile (HYD-3)
            return None
    return Found(LoadPath.RESENT, cached=cached, resent=length)


async def _shared_resent(
    engine: Engine, items: list[InputItem], owner: str | None, backend: Backend
) -> Found | None:
    """COMPAT-10: in a cluster, the stored response of ``owner`` whose full item list is the
    longest candidate prefix of ``items``, from the resend index (one batched read), hydrated
    owner-checked and confirmed by its own items' digest: served on the store path (COMPAT-4)
    over the rest of the input, as a ``previous_response_id`` continuation of it is. Anything
    else (no entry, deleted or expired, another route's, unfinished, a store that cannot say)
    is None: the stateless path."""
    resends = engine.resends
    if not resends.enabled:  # one node, or a store nobody else reads: nothing asked
        return None
    digests = prefix_digests(items)  # the index's keys: rolling, one hash per item
    hit = await resends.find(owner, items, digests)
    if hit is None:
        return None
    response_id, length = hit
    if any(map(_sealed, items[length:])):  # its runs replay exactly (SEAL-4)
        return None
    try:
        stored = await engine.store.hydrate(response_id, owner)  # owner before decode (OWN-5)
    except StoreError:
        stored = None
    if (
        stored is None
        or stored.record.response.status not in ("completed", "incomplete")
        or _route(engine, stored.record.response.model) is not backend
        or Rolling().over(stored.items).digest != digests[length - 1]
    ):
        engine.counters["resend.shared_stale"] += 1
        return None
    engine.counters["resend.shared_hit"] += 1
    return Found(LoadPath.STORE, stored=stored, resent=length)


def _route(engine: Engine, model: str) -> Backend | None:
    """The route a model name is served by now (a resend continues on its own, COMPAT-7)."""
    router = engine.router
    return router.routes.get(model) or router.default


def _sealed(item: InputItem) -> bool:
    return isinstance(item, Reasoning) and is_sealed(item.encrypted_content)


async def still_stored(engine: Engine, response_id: str) -> bool:
    """A cached context of a stored response is served only while the response exists (HYD-5).
    A delete by another process may never reach this one (SQLite shared by workers; Redis
    pub/sub is at-most-once, and a subscriber cut off across a delete never hears of it), so
    every hit outside the memory store is confirmed with one read of the record's head line
    (STORE-20); the memory store's deletes reach the caches, its evictions (LIM-5, MEM-15) and
    expiries do not, so it is asked too, a dict lookup (STORE-2: a record linking a gone one
    is lost)."""
    store = engine.store
    if isinstance(store, MemoryStore):  # this process's own: evicted or expired? (no I/O)
        found = store.holds(response_id)
    else:
        try:
            found = await store.exists(response_id)
        except StoreError as exc:
            raise wire_error(exc, "previous_response_id") from None
    if not found:
        engine.hydrated.discard(response_id)
    return found
