"""Micro figures of the SQLite store (STORE-13, STORE-19), in-process, no server:

* ``put``: one writer awaiting ``put`` after ``put`` of a small record (about 1 KB), paced
  ``--pause-ms`` apart, the way one agent's turns reach the store; per-put latency (median,
  p99, mean) and how many committed inline (on the loop) or via the store's thread. Paced runs
  cross several checkpoints (one per second), so the log restarts after them are in the figure.
* ``wal``: ``--writers`` concurrent writers of ``--record-kb`` records for ``--seconds``, as
  fast as the store takes them, while a thread samples the write-ahead log's file size every
  5 ms; the largest size seen is the figure STORE-19 bounds.

``python -m bench.sqlite_micro put`` / ``… wal`` (see ``--help``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

from engine.store import ResponseRecord, chain_record, open_store
from engine.store.embedded import inline as sqlite_inline
from engine.store.embedded.sqlite import SqliteStore
from protocol.items import Message
from protocol.response import Response


def _record(n: int, size: int) -> ResponseRecord:
    response = Response(id=f"resp_micro_{n:08d}", created_at=0, model="sim", status="completed")
    return chain_record(response, [], [Message(role="user", content="x" * size)], None)


async def _open(path: Path, query: str) -> SqliteStore:
    store = open_store(f"sqlite:///{path}{query}")
    assert isinstance(store, SqliteStore)
    await store.open()
    return store


async def bench_put(path: Path, args: argparse.Namespace) -> str:
    store = await _open(path, args.query)
    try:
        for n in range(50):  # warm-up: the file, the caches, the inline connection
            await store.put(_record(n, 1000))
        warm = store._inline.commits if store._inline is not None else 0
        taken: list[float] = []
        for n in range(args.puts):
            record = _record(1000 + n, 1000)
            start = time.perf_counter()
            await store.put(record)
            taken.append(time.perf_counter() - start)
            if args.pause_ms:
                await asyncio.sleep(args.pause_ms / 1000)
        inline = (store._inline.commits if store._inline is not None else 0) - warm
        restarts = getattr(store._inline, "restarts", 0)  # handed over: the log would restart
    finally:
        await store.close()
    taken.sort()
    p99 = taken[int(len(taken) * 0.99) - 1]
    return (
        f"put: {len(taken)} puts, {args.pause_ms} ms apart: median"
        f" {statistics.median(taken) * 1e6:.0f} µs, p99 {p99 * 1e6:.0f} µs, mean"
        f" {statistics.fmean(taken) * 1e6:.0f} µs; {inline} inline (of {len(taken)}),"
        f" {restarts} handed to the thread as log restarts"
    )


async def bench_wal(path: Path, args: argparse.Namespace) -> str:
    store = await _open(path, args.query)
    wal = Path(f"{path}-wal")
    largest = [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.005):
            with contextlib.suppress(FileNotFoundError):
                largest[0] = max(largest[0], wal.stat().st_size)

    sampler = threading.Thread(target=sample, name="wal-sampler", daemon=True)
    sampler.start()
    written = [0]
    end = time.monotonic() + args.seconds

    async def writer(w: int) -> None:
        n = 0
        while time.monotonic() < end:
            await store.put(_record(w * 10_000_000 + n, args.record_kb * 1024))
            n += 1
        written[0] += n

    try:
        await asyncio.gather(*(writer(w) for w in range(args.writers)))
    finally:
        await store.close()
        stop.set()
        sampler.join()
    mib = args.record_kb * written[0] / 1024
    return (
        f"wal: {args.writers} writers x {args.seconds:.0f} s of {args.record_kb} KiB records:"
        f" {written[0]} puts ({mib:.0f} MiB); largest WAL file {largest[0] / 2**20:.2f} MiB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.sqlite_micro")
    parser.add_argument("what", choices=["put", "wal"])
    parser.add_argument("--query", default="", help="store URL options, e.g. ?inline=off")
    parser.add_argument("--puts", type=int, default=3000)
    parser.add_argument("--pause-ms", type=float, default=1.0)
    parser.add_argument("--writers", type=int, default=16)
    parser.add_argument("--record-kb", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument(
        "--no-stall-guard",
        action="store_true",
        help="measure the inline path itself: a busy machine's scheduling stalls would turn it"
        " off for 30 s (STORE-13's guard) and the figure would be the thread's",
    )
    args = parser.parse_args()
    if args.no_stall_guard:
        sqlite_inline.STALL_S = float("inf")
    with tempfile.TemporaryDirectory(prefix="rollout-micro-", dir=os.environ.get("TMPDIR")) as tmp:
        run = bench_put if args.what == "put" else bench_wal
        print(asyncio.run(run(Path(tmp) / "micro.db", args)))


if __name__ == "__main__":
    main()
