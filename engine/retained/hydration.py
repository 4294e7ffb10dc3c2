"""The per-process hydration cache (SPEC: HYD-1..HYD-5).

Recently finished ``store: true`` responses keep their processed context (items, rendered
tokens, tool-call ledger) here, keyed by response id. A continuation that names one of them
from anywhere in this process (an HTTP ``previous_response_id``, a new WebSocket connection, an
older id on a live connection) forks that context and runs pre-inference only over its new
items, instead of hydrating the whole chain from the store and re-processing it.

Bounded in bytes, not entries: a long conversation costs what it holds, measured as the real
bytes its items, ledgers and token buffers occupy (MEM-10), so an image costs its data, not a
token estimate. The least
recently used entries go first. The cache shares the context object with the response's lane
cache, so it costs no copy at publication; whoever moves that context on (the compat fast path)
must ``discard`` the entry first (HYD-3).

A ``store: false`` response's context is kept too, but only a resend finds it (COMPAT-7): it is
indexed by its owner, its full item list's length and its last item's digest
(``conversation/resend.py``), as is a stored one's, and its id continues nothing (CACHE-2). One
bound holds both.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Any

from engine.conversation.context import Context
from engine.conversation.footprint import deep_size
from engine.conversation.resend import Held, Sent, holds, item_digest
from engine.models.base import Backend
from protocol.items import InputItem
from protocol.tools import Toolset

HeaderKey = tuple[str | None, Toolset]  # a context's instructions and tools (PIPE-4)

# The entry itself (MEM-11): its object, the LRU's link and dict slot, the response id string.
ENTRY_OVERHEAD = 400
# Its place in the resend index (COMPAT-9), as ``sys.getsizeof`` sees it: the (owner, length)
# key tuple (56), the dict of last items' digests under it (224), the list of ids under one
# (88), the outer dict's slot (48) and its last item's digest (49). It was 200, which left a
# resend's entry charged 17% under what tracemalloc sees it hold, then 560 while a context also
# kept its list's rolling digest for this index (tests/engine/test_resend_footprint.py).
DIGEST_OVERHEAD = 465
# A remembered input's place in the index of raw inputs (COMPAT-7): the key tuple, the dict of
# last items' bytes under it, the list of ids, the slot (the bytes themselves are ``Sent``'s).
SENT_INDEX_OVERHEAD = 416


@dataclass(slots=True)
class CachedContext:
    """One cached context: what a continuation needs to skip the store and full pre-inference."""

    response_id: str
    ctx: Context
    backend: Backend
    owner: str | None  # the API-key identity that created the response (OWN-1)
    nbytes: int  # the size it was charged at (``Context.retained_bytes`` when published)
    stored: bool = True  # a ``store: true`` response: its id continues it (HYD-1)
    resendable: bool = False  # filed in the resend index (COMPAT-7)
    length: int = 0  # the context's items when published: grown past them, it is stale
    tail: bytes = b""  # its last item's digest: where the resend index files it (COMPAT-7)
    sent: Sent | None = None  # its create's input as it came over HTTP (COMPAT-7)


class HydrationCache:
    """A bounded LRU of contexts by response id, sized in bytes (HYD-2)."""

    def __init__(self, max_bytes: int, counters: Counter[str]) -> None:
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._entries: OrderedDict[str, CachedContext] = OrderedDict()
        self._counters = counters
        # (owner, a full item list's length) -> its last item's digest -> the responses whose
        # lists those are (COMPAT-7): a resend's candidates, each confirmed item for item
        self._lists: dict[tuple[str | None, int], dict[bytes, list[str]]] = {}
        # (owner, a create's raw input items) -> the last one's bytes -> the responses whose
        # creates sent those (COMPAT-7): what a resend's first items were decoded to before
        self._raws: dict[tuple[str | None, int], dict[bytes, list[str]]] = {}

    def publish(
        self,
        response_id: str,
        ctx: Context,
        backend: Backend,
        owner: str | None,
        *,
        stored: bool = True,
        resendable: bool = False,
        sent: Sent | None = None,
    ) -> None:
        """Remember a finished response's context (no copy: see the module docstring);
        ``resendable``: file it in the resend index, so that a resend of its full item list
        finds it (COMPAT-7: by its length and its last item's digest, one hash however long
        the list; the list's rolling digest is the cluster index's alone, COMPAT-10);
        ``sent``: its create's raw input, so that a resend's equal items are not decoded."""
        size = ctx.retained_bytes + ENTRY_OVERHEAD + (DIGEST_OVERHEAD if resendable else 0)
        if sent is not None and resendable:
            _charge(sent, ctx)
            size += sent.nbytes + SENT_INDEX_OVERHEAD
        else:
            sent = None
        if size > self.max_bytes:
            return  # it would evict everything else and still not fit
        self.discard(response_id)
        length = len(ctx.items)
        entry = CachedContext(response_id, ctx, backend, owner, size, stored, resendable, length)
        self._entries[response_id] = entry
        if resendable and length:
            entry.tail = item_digest(ctx.items[-1])
            filed = self._lists.setdefault(_key(owner, length), {})
            filed.setdefault(entry.tail, []).append(response_id)
        if sent is not None:
            entry.sent = sent
            raws = self._raws.setdefault(_key(owner, len(sent.items)), {})
            raws.setdefault(sent.last, []).append(response_id)
        self.nbytes += size
        while self.nbytes > self.max_bytes:
            _, old = self._entries.popitem(last=False)
            self._forget(old)
            self._counters["hydration.evicted"] += 1

    def resent(
        self,
        owner: str | None,
        items: list[InputItem],
        backend: Backend,
        header: HeaderKey | None = None,
    ) -> tuple[CachedContext, int] | None:
        """The entry of ``owner`` whose full item list is the longest prefix of a request's
        ``items`` and that ``backend`` sampled, with that prefix's length; counts
        ``resend.hit`` or ``resend.miss`` (COMPAT-7, COMPAT-9). Another owner's lists are not
        looked at. Only a length some list of ``owner``'s has costs a digest (of the item
        that list would end with), and only a list filed under it is compared, item for item
        (``conversation.resend.holds``). Of equal lists, one rendered under the create's
        ``header`` (its instructions and tools) is taken first: another's would re-render
        the header, and with it a ``tokens`` route's whole history (PIPE-4)."""
        lists = self._lists
        for k in range(len(items), 0, -1):
            filed = lists.get(_key(owner, k))
            if filed is None:
                continue
            found: CachedContext | None = None
            for response_id in list(filed.get(item_digest(items[k - 1]), ())):
                entry = self._match(response_id, items, k, backend)
                if entry is not None and (found is None or entry.ctx.header_key == header):
                    found = entry
                    if entry.ctx.header_key == header:
                        break
            if found is not None:
                self._entries.move_to_end(found.response_id)
                self._counters["resend.hit"] += 1
                return found, k
        self._counters["resend.miss"] += 1
        return None

    def held(self, owner: str | None, raws: list[Any]) -> Held | None:
        """The longest run of a create's first raw items (``msgspec.Raw``) equal, byte for byte,
        to the input a create of ``owner`` sent before whose response is cached, with what they
        were decoded to (COMPAT-7); counts the items not decoded again (``resend.raw_held``).
        Only a length some remembered input of ``owner``'s has is looked at: its last item's
        bytes find the candidates, and the joined bytes confirm one."""
        raw_lists = self._raws
        for k in range(len(raws), 0, -1):
            filed = raw_lists.get(_key(owner, k))
            if filed is None:
                continue
            ids = filed.get(bytes(raws[k - 1]))
            if not ids:
                continue
            joined = b",".join(raws[:k])
            for response_id in ids:
                sent = self._entries[response_id].sent
                if sent is not None and sent.joined == joined:
                    self._counters["resend.raw_held"] += k
                    return Held(sent, k)
        return None

    def _match(
        self, response_id: str, items: list[InputItem], length: int, backend: Backend
    ) -> CachedContext | None:
        entry = self._entries[response_id]
        if entry.backend is not backend:
            return None
        if len(entry.ctx.items) != entry.length:  # moved on, never served (HYD-3)
            self.discard(response_id)
            return None
        if not holds(entry.ctx.items, items, length):
            return None
        return entry

    def get(
        self, response_id: str, owner: str | None, supports: frozenset[str]
    ) -> CachedContext | None:
        """The entry, if cached, created by ``owner`` and readable by a backend that
        ``supports`` these content kinds; counts a hit or a miss (HYD-4).

        An entry of another owner is a miss: the caller then answers not-found (OWN-2). So is a
        context validated for a backend that reads more than the new one: the store path then
        re-validates the history against the new route (COMPAT-4)."""
        entry = self._entries.get(response_id)
        if (
            entry is None
            or not entry.stored  # a store: false response's id continues nothing (CACHE-2)
            or entry.owner != owner
            or not entry.backend.supports <= supports
        ):
            self._counters["hydration.miss"] += 1
            return None
        self._entries.move_to_end(response_id)
        self._counters["hydration.hit"] += 1
        return entry

    def copy_out(self, response_id: str) -> None:
        """The entry's shared context is about to move on (a parked HTTP chain's rollout resumes,
        PARK-4): the entry keeps a copy of it instead, so a fork from that response is served
        from here as before (HYD-1), and charged the same."""
        entry = self._entries.get(response_id)
        if entry is not None:
            entry.ctx = entry.ctx.fork()

    def holds(self, entry: CachedContext) -> bool:
        """``entry`` is still cached: no path has moved its context on since ``get`` (HYD-3)."""
        return self._entries.get(entry.response_id) is entry

    def discard(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is None:
            return False
        self._forget(entry)
        return True

    def _forget(self, entry: CachedContext) -> None:
        self.nbytes -= entry.nbytes
        if entry.tail:
            _unfile(self._lists, _key(entry.owner, entry.length), entry.tail, entry.response_id)
        sent = entry.sent
        if sent is not None:
            key = _key(entry.owner, len(sent.items))
            _unfile(self._raws, key, sent.last, entry.response_id)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, response_id: object) -> bool:
        return response_id in self._entries


def _unfile(
    index: dict[tuple[str | None, int], dict[bytes, list[str]]],
    key: tuple[str | None, int],
    last: bytes,
    response_id: str,
) -> None:
    """Take ``response_id`` out of one of the resend indexes, and the slots it leaves empty."""
    filed = index[key]
    ids = filed[last]
    ids.remove(response_id)
    if not ids:
        del filed[last]
    if not filed:
        del index[key]


def _charge(sent: Sent, ctx: Context) -> None:
    """``sent.cost`` past the items a held input lent it: the bytes of each item this create
    decoded that its context does not hold itself (MEM-10)."""
    cost, items, held = sent.cost, sent.items, ctx.items
    total = cost[-1]
    for index in range(len(cost) - 1, len(items)):
        item = items[index]
        if index >= len(held) or held[index] is not item:
            total += deep_size(item)
        cost.append(total)


def _key(owner: str | None, length: int) -> tuple[str | None, int]:
    """A list is looked up under its owner: another key's identical list is another entry
    (COMPAT-9, OWN-2)."""
    return (owner, length)
