"""The cluster-state port: what the processes sharing one store tell each other, beside the
records (SPEC: IDEM-3, PARK-9, PARK-20..22, RATE-7, CONV-7).

``ResponseStore`` keeps records (put, get, hydrate, delete, list); its ``cluster`` is this port:
idempotency keys, exclusive claims (the conversation lock), parked rollouts' addresses, rate
counters, delete and continued notices, and the node-to-node token. One implementation per
backend: this class serves the single-process stores (memory; SQLite's ``SqliteClusterState``
overrides ``_claim``), ``RedisClusterState`` and ``PostgresClusterState`` live with their
backends. The port reaches its backend only through ``RecordBlobs``: the store's availability
guard, its blob primitives (``_read_one``, ``_write``, ``_remove``) and its owner salt.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

from engine.store.framing import head_line
from engine.store.ratelimits import Counters, LocalCounters

log = logging.getLogger("rollout.store")

IDEM_PREFIX = "idem:"  # idempotency keys' entries (IDEM-3); response ids start "resp_"
_IDEM_HEAD = head_line(None, True)  # invisible to every response route (IDEM-3)
RESEND_PREFIX = "resend:"  # the shared resend index's entries (COMPAT-10)

DeleteListener = Callable[[str], None]
ContinuedListener = Callable[[str], None]  # a response continued from the store (PARK-9)
T = TypeVar("T")


class RecordBlobs(Protocol):
    """What the port uses of its record store (``ResponseStore``): the availability guard,
    the blob primitives and the owner salt. Internal to ``engine.store``."""

    async def _guard(self, op: Awaitable[T]) -> T: ...

    async def _read(self, keys: Sequence[str]) -> list[bytes | None]: ...

    async def _read_one(self, key: str) -> bytes | None: ...

    async def _write(
        self, key: str, blob: bytes, links: Sequence[str], refresh: bool, expires_at: float | None
    ) -> None: ...

    async def _remove(self, key: str) -> bool: ...

    async def _owner_salt(self) -> bytes: ...


class ClusterState:
    """One store's cluster state. Every coroutine may raise ``StoreUnavailable``."""

    shares_parking = False  # keeps parked rollouts' addresses (PARK-20)
    shares_limits = False  # counts rate limits for every process on the store (RATE-7, LIVE-6)
    shares_resends = False  # every node reads the resend index (COMPAT-10)

    def __init__(self, store: RecordBlobs) -> None:
        self.store = store
        # Rate-limit counters (RATE-7): this process's; a shared store replaces them with its own.
        self.limits: Counters = LocalCounters()
        self._delete_listeners: list[DeleteListener] = []
        self._continued_listeners: list[ContinuedListener] = []

    # ------------------------------------------------------------------ idempotency keys
    async def claim_key(self, key: str, entry: bytes, ttl_s: float) -> bytes | None:
        """Claim an idempotency key for ``ttl_s`` (IDEM-3): None if this caller now holds it
        (``entry`` stored), else the live entry another request stored first. Atomic across
        every process sharing the store. Entries live beside the records, under keys
        prefixed ``IDEM_PREFIX``, behind a tombstone's head line (STORE-20): a response route
        given such a key finds nothing, reads nothing and deletes nothing."""
        held = await self.claim(IDEM_PREFIX + key, _IDEM_HEAD + entry, time.time() + ttl_s)
        return None if held is None else held[len(_IDEM_HEAD) :]

    async def settle_key(self, key: str, entry: bytes, ttl_s: float) -> None:
        """Replace a claimed key's entry (its outcome), for ``ttl_s`` from now (IDEM-3)."""
        blob, expires_at = _IDEM_HEAD + entry, time.time() + ttl_s
        store = self.store
        await store._guard(store._write(IDEM_PREFIX + key, blob, (), False, expires_at))

    async def release_key(self, key: str, entry: bytes) -> None:
        """Forget a claimed key: its request did no work, so the next one with it runs. Only
        while it still holds ``entry``, the claim this caller made (IDEM-3, compare-and-delete
        as CONV-7's lock): a claim that lapsed and was claimed again is the new holder's."""
        await self.release(IDEM_PREFIX + key, _IDEM_HEAD + entry)

    async def claim(self, key: str, blob: bytes, expires_at: float) -> bytes | None:
        """Store ``blob`` under ``key`` until ``expires_at`` unless a live value is there;
        return that value (None: claimed). Atomic across the processes sharing the store: what
        idempotency keys and the conversation lock (CONV-7) stand on."""
        return await self.store._guard(self._claim(key, blob, expires_at))

    async def _claim(self, key: str, blob: bytes, expires_at: float) -> bytes | None:
        """This default is atomic only where ``_read_one`` and ``_write`` never suspend
        (memory); shared backends override it with one atomic operation."""
        held = await self.store._read_one(key)
        if held is not None:
            return held
        await self.store._write(key, blob, (), False, expires_at)
        return None

    async def release(self, key: str, blob: bytes) -> bool:
        """Remove ``key`` only while it still holds ``blob`` (compare-and-delete): a claim is
        released by its holder alone (CONV-7). A claim that lapsed and was claimed again is
        the new holder's, and this leaves it in place. True if this removed it."""
        return await self.store._guard(self._release(key, blob))

    async def _release(self, key: str, blob: bytes) -> bool:
        """This default is atomic only where ``_read_one`` and ``_remove`` never suspend
        (memory); shared backends override it with one atomic operation."""
        if await self.store._read_one(key) != blob:
            return False
        return await self.store._remove(key)

    # ------------------------------------------------------------------ the resend index
    async def index_resend(
        self, owner: str | None, digest: bytes, response_id: str, expires_at: float | None
    ) -> None:
        """Note that ``owner``'s stored response ``response_id`` has the full item list whose
        digest is ``digest`` (COMPAT-10), until ``expires_at`` (the record's own). Beside the
        records, behind a tombstone's head line as idempotency keys are (IDEM-3): no response
        route reads, lists or deletes it."""
        blob, store = _IDEM_HEAD + response_id.encode(), self.store
        await store._guard(store._write(resend_key(owner, digest), blob, (), False, expires_at))

    async def resent_among(self, owner: str | None, digests: Sequence[bytes]) -> list[str | None]:
        """The response each digest of ``owner``'s is indexed to (None: none), in one round
        trip (Redis ``MGET``, one SQL query), COMPAT-10."""
        store = self.store
        blobs = await store._guard(store._read([resend_key(owner, d) for d in digests]))
        head = len(_IDEM_HEAD)
        return [None if blob is None else bytes(blob[head:]).decode() for blob in blobs]

    # ------------------------------------------------------------------ parked rollouts
    async def register_parked(self, response_id: str, address: str, ttl_s: float) -> None:
        """Note for ``ttl_s`` that the rollout suspended behind ``response_id`` is parked by the
        node answering at ``address`` (PARK-20). A single-process store has nobody to tell."""
        await self.store._guard(self._set_parked(response_id, address, ttl_s))

    async def parked_at(self, response_id: str) -> str | None:
        """The address of the node parking ``response_id``'s rollout, if one registered it."""
        return await self.store._guard(self._get_parked(response_id))

    async def unregister_parked(self, response_id: str) -> None:
        await self.store._guard(self._set_parked(response_id, None, 0))

    async def _set_parked(self, response_id: str, address: str | None, ttl_s: float) -> None:
        """Keep (``address``) or drop (None) a parked rollout's address; nothing by default."""
        return None

    async def _get_parked(self, response_id: str) -> str | None:
        return None

    async def node_token(self, message: str) -> str:
        """A proof that the sender shares this store (PARK-22): HMAC-sha256 of ``message``
        under a key derived from the store's owner salt, which no client ever sees (OWN-6)."""
        salt = await self.store._owner_salt()
        key = hmac.new(salt, b"rollout node-to-node", hashlib.sha256).digest()
        return hmac.new(key, message.encode(), hashlib.sha256).hexdigest()

    # ------------------------------------------------------------------ notices
    def on_delete(self, listener: DeleteListener) -> None:
        """``listener(response_id)`` runs (on the event loop) for every delete of this store,
        including deletes made by other processes where the backend can tell (Redis)."""
        self._delete_listeners.append(listener)

    def notify_deleted(self, response_id: str) -> None:
        for listener in self._delete_listeners:
            try:
                listener(response_id)
            except Exception:
                log.exception("store: delete listener failed for %s", response_id)

    async def announce_continued(self, response_id: str) -> None:
        """Tell every process sharing this store that ``response_id`` was just continued from
        the store here, so one that still parks the rollout suspended behind it retires it
        (PARK-9). This process's listeners run at once; a shared backend also publishes it
        (Redis: channel ``rollout:continued``). Single-process stores reach only this process."""
        self.notify_continued(response_id)
        await self.store._guard(self._publish_continued(response_id))

    def on_continued(self, listener: ContinuedListener) -> None:
        """``listener(response_id)`` runs (on the event loop) for every continued notice, this
        process's and, where the backend carries them (Redis), every other process's."""
        self._continued_listeners.append(listener)

    def notify_continued(self, response_id: str) -> None:
        for listener in self._continued_listeners:
            try:
                listener(response_id)
            except Exception:
                log.exception("store: continued listener failed for %s", response_id)

    async def _publish_continued(self, response_id: str) -> None:
        """Reach the other processes sharing this store; nothing to reach by default."""
        return None


def resend_key(owner: str | None, digest: bytes) -> str:
    """A resend index entry's key: the owner's salted digest (OWN-6; ``-`` on an open server),
    never a key, and the item list's digest (COMPAT-10)."""
    return f"{RESEND_PREFIX}{owner or '-'}:{digest.hex()}"
