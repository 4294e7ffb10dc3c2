"""The cluster's resend index (SPEC: COMPAT-10).

A resend (COMPAT-7) is matched first against this process's hydration cache; a cluster's
balancer may land it on a node that never held the context. So where the store is shared and
the node has a cluster address (the nodes of ``rollout cluster``, PARK-20), every stored
response also notes, beside its record, ``(owner digest, digest of its full item list) → its
id`` (``ClusterState.index_resend``), expiring with the record. A node whose cache misses asks
for the input's candidate digests in one batched read and hands the id it finds to the one
loader (``connection/loader.py``), which hydrates it owner-checked and serves it on the store
path (COMPAT-4) like a ``previous_response_id`` continuation of it. This module only writes
and reads the index; the loader decides.

Candidates are the prefixes a response's list can end with: the end of each run of items a
sampling step writes (``made_by_model``) that the next item does not extend, at most
``MAX_CANDIDATES`` of them, the longest first.
"""

from __future__ import annotations

import logging
import time
from collections import Counter

from engine.conversation.carried import made_by_model
from engine.retained.handover import Handover
from engine.store import ResponseStore, StoreError
from engine.store.records import SLACK_FRACTION
from protocol.items import InputItem

log = logging.getLogger("rollout.resend")

# Candidate prefixes asked for in the one batched read (COMPAT-10): a resend continues one of
# the latest responses of its history, so the longest 32 ends are plenty and the read stays
# small (about 60 bytes a key).
MAX_CANDIDATES = 32


class SharedResends:
    """One per engine: the index's writes and its batched lookup (COMPAT-10)."""

    def __init__(self, store: ResponseStore, handover: Handover, counters: Counter[str]) -> None:
        self.store = store
        self._handover = handover
        self._counters = counters

    @property
    def enabled(self) -> bool:
        """A shared store and a node address (cluster mode): nothing at all otherwise."""
        return self._handover.address is not None and self.store.cluster.shares_resends

    async def publish(self, owner: str | None, digest: bytes, response_id: str) -> None:
        """Index a stored response's full item list, for as long as its record lives. A failed
        write costs only a later resend elsewhere its continuation (it starts afresh): counted
        and logged, never raised."""
        ttl = self.store.ttl_s
        expires_at = time.time() + ttl * (1 + SLACK_FRACTION) if ttl > 0 else None
        try:
            await self.store.cluster.index_resend(owner, digest, response_id, expires_at)
        except StoreError as exc:
            self._counters["resend.index_failed"] += 1
            log.warning("store: resend index entry of %s not written: %s", response_id, exc)

    async def find(
        self, owner: str | None, items: list[InputItem], digests: list[bytes]
    ) -> tuple[str, int] | None:
        """The response indexed under ``owner`` whose list is the longest candidate prefix of
        ``items`` (``digests``: of every prefix), with that prefix's length; one batched read.
        Counts ``resend.shared_miss``; a store that cannot say is a miss too."""
        ends = candidate_ends(items)
        if ends:
            try:
                found = await self.store.cluster.resent_among(
                    owner, [digests[end - 1] for end in ends]
                )
            except StoreError as exc:
                log.warning("store: resend index unreadable: %s", exc)
                found = []
            for end, response_id in zip(ends, found, strict=False):
                if response_id is not None:
                    return response_id, end
        self._counters["resend.shared_miss"] += 1
        return None


def candidate_ends(items: list[InputItem]) -> list[int]:
    """The lengths of the prefixes of ``items`` a response's full list can be, longest first
    (at most ``MAX_CANDIDATES``): a response's list ends with its output, items a sampling step
    writes, and a resend's next item is the client's own (a tool's output, a user message)."""
    ends: list[int] = []
    follows = False  # the item after the one looked at is the model's
    for end in range(len(items), 0, -1):
        made = made_by_model(items[end - 1])
        if made and not follows:
            ends.append(end)
            if len(ends) == MAX_CANDIDATES:
                break
        follows = made
    return ends
