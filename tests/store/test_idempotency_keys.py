"""Idempotency keys in the shared store (IDEM-3): on each durable backend (a SQLite file, a real
Redis, a real Postgres) two processes' stores claiming one key at once get exactly one claim,
the other reads the holder's entry; a settled entry replaces it; a released key is free again;
an expired one is claimed afresh. Two store instances on one backend stand for two nodes."""

from __future__ import annotations

import asyncio
import time

from engine.store import open_store
from engine.store.cluster_state import IDEM_PREFIX
from engine.store.memory import MemoryStore
from engine.store.records import ResponseStore


async def _opened(url: str) -> ResponseStore:
    store = open_store(url)
    await store.open()
    return store


async def _claims(a: ResponseStore, b: ResponseStore) -> None:
    key = f"owner:{time.time_ns()}"
    results = await asyncio.gather(
        *(
            store.cluster.claim_key(key, f"entry-{i}".encode(), 60.0)
            for i, store in enumerate([a, b] * 4)
        )
    )
    claimed = [i for i, held in enumerate(results) if held is None]
    assert len(claimed) == 1, results  # exactly one of the eight claims won
    winner = f"entry-{claimed[0] % 2}".encode()
    assert all(held == winner for held in results if held is not None)
    await a.cluster.settle_key(key, b"done", 60.0)
    assert await b.cluster.claim_key(key, b"late", 60.0) == b"done"  # the outcome, not a new claim
    await b.cluster.release_key(key, b"not-held")  # not its holder's entry: nothing freed
    assert await a.cluster.claim_key(key, b"late", 60.0) == b"done"
    await b.cluster.release_key(key, b"done")
    assert await a.cluster.claim_key(key, b"again", 60.0) is None  # released: free again
    expiring = f"owner:{time.time_ns()}:short"
    assert await a.cluster.claim_key(expiring, b"first", 0.001) is None
    await asyncio.sleep(0.01)  # past the 1 ms lifetime (a deadline in the store, not a sync)
    assert await b.cluster.claim_key(expiring, b"second", 60.0) is None
    # IDEM-3: the lapsed first claim's late release leaves the second claim in place
    await a.cluster.release_key(expiring, b"first")
    assert await a.cluster.claim_key(expiring, b"third", 60.0) == b"second"
    # Never a response: not read, not probed, not deleted (a tombstone's head line).
    assert await a.get(IDEM_PREFIX + key) is None
    assert not await a.exists(IDEM_PREFIX + key)
    assert not await a.delete(IDEM_PREFIX + key)
    assert await b.cluster.claim_key(key, b"x", 60.0) == b"again"


async def test_one_claim_wins_across_two_stores(store_url: str) -> None:
    a, b = await _opened(store_url), await _opened(store_url)
    try:
        await _claims(a, b)
    finally:
        await a.close()
        await b.close()


async def test_one_claim_wins_in_memory() -> None:
    store = MemoryStore()
    await _claims(store, store)
