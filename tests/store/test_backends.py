"""The store interface against each real backend (STORE-4..STORE-9): flat records, snapshots,
hydration, deletes and their listeners, retention, corrupt and oversized records; the record's
head line and the salted owner digest (STORE-20, OWN-5, OWN-6)."""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import msgspec
import pytest

from engine.store import (
    SNAPSHOT_EVERY,
    ChainPoint,
    MemoryStore,
    RecordCorrupt,
    RecordTooLarge,
    ResponseRecord,
    ResponseStore,
    StoreUnavailable,
    chain_record,
    open_store,
)
from engine.store.embedded.sqlite import SCHEMA_VERSION, SqliteStore
from engine.store.framing import ANY_OWNER, peek
from engine.store.postgres import PostgresStore
from engine.store.records import _ENCODER
from engine.store.redis import RedisStore
from protocol.items import InputItem, Message
from protocol.response import Response
from tests.store._procs import RedisServer

Factory = Callable[..., ResponseStore]


@pytest.fixture(params=["memory", "sqlite", "redis", "postgres"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Factory:
    """A factory for the backend under test (same data for every store it makes)."""
    if request.param == "memory":
        shared = MemoryStore()
        return lambda **kw: _memory(shared, **kw)
    if request.param == "sqlite":
        return lambda **kw: SqliteStore(tmp_path / "s.db", **kw)
    if request.param == "postgres":
        url: str = request.getfixturevalue("postgres_url")
        return lambda **kw: PostgresStore(url, **kw)
    redis: RedisServer = request.getfixturevalue("redis_server")
    return lambda **kw: RedisStore(redis.url, **kw)


def _memory(shared: MemoryStore, **kw: float) -> MemoryStore:
    shared.ttl_s = kw.get("ttl_s", shared.ttl_s)
    shared.max_record_bytes = int(kw.get("max_record_bytes", shared.max_record_bytes))
    return shared


@pytest.fixture
async def store(make_store: Factory) -> AsyncIterator[ResponseStore]:
    opened = make_store()
    await opened.open()
    try:
        yield opened
    finally:
        await opened.close()


def _message(text: str) -> InputItem:
    return Message(role="user", content=text)


def _response(n: int) -> Response:
    return Response(id=f"resp_{n:04d}", created_at=0, model="sim", status="completed")


async def _chain(store: ResponseStore, length: int) -> tuple[list[ResponseRecord], list[InputItem]]:
    """``length`` turns of two new context items each, stored as the engine stores them."""
    context: list[InputItem] = []
    point: ChainPoint | None = None
    records = []
    for n in range(length):
        context += [_message(f"question {n}"), _message(f"answer {n}")]
        record = chain_record(_response(n), [context[-2]], context, point)
        await store.put(record)
        point = record.point
        records.append(record)
    return records, context


async def test_records_stay_flat_and_hydrate_whole(store: ResponseStore) -> None:
    records, context = await _chain(store, 3 * SNAPSHOT_EVERY + 2)
    for n, record in enumerate(records):
        assert len(record.links) < SNAPSHOT_EVERY  # hydration reads at most this many
        expected = 2 * (n + 1) if record.snapshot else 2  # O(new items), but at snapshots
        assert len(record.context) == expected
        assert record.snapshot == (n % SNAPSHOT_EVERY == 0)
    hydrated = await store.hydrate(records[-1].id)
    assert hydrated is not None and hydrated.items == context
    assert hydrated.point == records[-1].point
    assert hydrated.point.length == len(context) and hydrated.point.links == tuple(
        records[-1].links
    )
    middle = await store.hydrate(records[20].id)
    assert middle is not None and middle.items == context[:42]


async def test_delete_removes_and_notifies(store: ResponseStore) -> None:
    records, _ = await _chain(store, 4)
    heard: list[str] = []
    store.cluster.on_delete(heard.append)
    assert await store.exists(records[1].id) is True
    assert await store.delete(records[1].id) is True
    assert await store.get(records[1].id) is None
    assert await store.exists(records[1].id) is False  # a tombstone is not a response
    assert await store.exists(records[3].id) is True
    assert await store.exists("resp_never") is False
    assert await store.hydrate(records[1].id) is None
    later = await store.hydrate(records[3].id)  # still continuable: the tombstone is a link
    assert later is not None and len(later.items) == 8
    assert await store.delete(records[1].id) is False
    assert heard[:2] == [records[1].id, records[1].id]
    assert await store.delete("resp_never") is False


async def test_continued_notice_reaches_this_process_and_redis_peers(
    make_store: Factory,
) -> None:
    """PARK-9: a continued notice runs this process's listeners at once on every backend; on
    Redis it also reaches every other process sharing the store (another store instance here,
    its own subscriber connection), and a message too long to be a response id is ignored."""
    here, peer = make_store(), make_store()
    await here.open()
    await peer.open()
    heard_here: list[str] = []
    heard_peer: list[str] = []
    here.cluster.on_continued(heard_here.append)
    peer.cluster.on_continued(heard_peer.append)
    try:
        if isinstance(here, RedisStore):
            await _until_subscribed(here, peer)
        await here.cluster.announce_continued("resp_a")
        assert heard_here[:1] == ["resp_a"]
        if not isinstance(here, RedisStore):
            assert heard_peer == [] or peer is here  # nothing carries it to another process
            return
        for _ in range(400):
            if heard_peer and len(heard_here) == 2:
                break
            await asyncio.sleep(0.01)
        assert heard_peer == ["resp_a"]
        assert heard_here == ["resp_a", "resp_a"]  # its own subscriber hears it too: harmless
        await here.cluster._publish_continued("resp_" + "x" * 300)
        await here.cluster.announce_continued("resp_b")
        for _ in range(400):
            if heard_peer[-1:] == ["resp_b"]:
                break
            await asyncio.sleep(0.01)
        assert heard_peer == ["resp_a", "resp_b"]  # the oversized one was dropped
    finally:
        await here.close()
        await peer.close()


async def _until_subscribed(*stores: RedisStore) -> None:
    """Each store's subscriber connects in the background: wait until Redis counts them all."""
    import redis.asyncio as aioredis

    from engine.store.redis import CONTINUED_CHANNEL

    client = aioredis.Redis.from_url(stores[0].url)
    try:
        for _ in range(400):
            counts = dict(await client.pubsub_numsub(CONTINUED_CHANNEL))
            if counts.get(CONTINUED_CHANNEL.encode(), 0) >= len(stores):
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the subscribers never subscribed")
    finally:
        await client.aclose()


async def test_retention_expires_and_links_live_as_long_as_their_users(
    make_store: Factory,
) -> None:
    store = make_store(ttl_s=1.5)
    await store.open()
    try:
        (root,), _ = await _chain(store, 1)
        await asyncio.sleep(1.0)
        child = chain_record(_response(99), [], [_message("x")] * 3, root.point)
        await store.put(child)  # extends the root's life: the child's context needs it
        await asyncio.sleep(1.0)  # past the root's own expiry
        assert await store.hydrate(child.id) is not None
        await asyncio.sleep(1.0)  # past both
        assert await store.get(child.id) is None and await store.get(root.id) is None
    finally:
        await store.close()


async def test_oversized_record_is_refused(make_store: Factory) -> None:
    store = make_store(max_record_bytes=4096)
    await store.open()
    try:
        big = chain_record(_response(1), [], [_message("x" * 5000)], None)
        with pytest.raises(RecordTooLarge) as refused:
            await store.put(big)
        assert refused.value.limit == 4096 and refused.value.size > 5000
        assert await store.get(big.id) is None
    finally:
        await store.close()


async def test_corrupt_record_is_a_clean_error(store: ResponseStore) -> None:
    await store._write("resp_bad", b"\x93not a record", [], False, None)
    good = chain_record(_response(7), [], [_message("ok")], None)
    await store._write("resp_wrong_id", _ENCODER.encode(good), [], False, None)
    for rid in ("resp_bad", "resp_wrong_id"):
        with pytest.raises(RecordCorrupt):
            await store.get(rid)
        with pytest.raises(RecordCorrupt):
            await store.hydrate(rid)
    with pytest.raises(RecordCorrupt):
        await store.exists("resp_bad")
    assert store.available  # a bad record is not an outage


async def test_another_owner_is_not_found_before_any_decoding(store: ResponseStore) -> None:
    """OWN-2: with ``owner``, the record's owner field is read first; another owner's record
    is None however broken the rest of it is, so no body of theirs is ever decoded."""
    record = chain_record(_response(8), [], [_message("mine")], None, owner="alice")
    await store.put(record)
    assert (await store.get(record.id, owner="alice")) is not None
    assert await store.get(record.id, owner="bob") is None
    assert await store.get(record.id, owner=None) is None  # no key is not another's key
    assert await store.hydrate(record.id, owner="bob") is None
    hydrated = await store.hydrate(record.id, owner="alice")
    assert hydrated is not None and hydrated.items == [_message("mine")]
    broken = b'{"owner":"alice","version":1,"response":42}'  # an undecodable body
    await store._write("resp_broken", broken, [], False, None)
    assert await store.get("resp_broken", owner="bob") is None
    assert await store.hydrate("resp_broken", owner="bob") is None
    with pytest.raises(RecordCorrupt):  # its owner gets the corrupt-record answer (STORE-9)
        await store.get("resp_broken", owner="alice")


async def test_concurrent_writes_all_land(store: ResponseStore) -> None:
    records = [chain_record(_response(n), [], [_message(str(n))], None) for n in range(200)]
    await asyncio.gather(*(store.put(r) for r in records))
    got = await asyncio.gather(*(store.get(r.id) for r in records))
    assert [g.id if g else None for g in got] == [r.id for r in records]


async def test_sqlite_schema_is_versioned(tmp_path: Path) -> None:
    path = tmp_path / "v.db"
    store = SqliteStore(path)
    await store.open()
    await store.close()
    with sqlite3.connect(path) as conn:
        assert (
            conn.execute("SELECT max(version) FROM schema_version").fetchone()[0] == SCHEMA_VERSION
        )
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        conn.execute("INSERT INTO schema_version VALUES (?)", (SCHEMA_VERSION + 1,))
    newer = SqliteStore(path)
    with pytest.raises(StoreUnavailable, match="newer"):
        await newer.open()


async def test_sqlite_file_that_is_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreUnavailable):
        await SqliteStore(path).open()


async def test_redis_down_is_unavailable_then_recovers(redis_server: RedisServer) -> None:
    store = RedisStore(redis_server.url)
    await store.open()
    try:
        (record,), _ = await _chain(store, 1)
        await redis_server.kill()
        with pytest.raises(StoreUnavailable):
            await store.get(record.id)
        assert not store.available and not await store.health()
        await redis_server.start()  # appendfsync always: the record survived Redis too
        assert await store.health() and store.available
        assert await store.get(record.id) is not None
    finally:
        await store.close()


def test_store_urls(tmp_path: Path) -> None:
    relative = open_store("sqlite:///data/rollout.db")
    assert isinstance(relative, SqliteStore) and relative.path == Path("data/rollout.db")
    absolute = open_store(f"sqlite:///{tmp_path}/x.db?synchronous=normal")
    assert isinstance(absolute, SqliteStore) and absolute.path == tmp_path / "x.db"
    assert absolute.synchronous == "NORMAL"
    assert isinstance(open_store("rediss://h:6380/2"), RedisStore)
    assert isinstance(open_store("memory://"), MemoryStore)
    for pg in ("postgresql://u@h:5433/db", "postgres://h/db?sslmode=require"):
        assert isinstance(open_store(pg), PostgresStore)
    for bad in ("postgresql:///db", "sqlite:///", "nothing", "sqlite:///x.db?synchronous=off"):
        with pytest.raises(ValueError):
            open_store(bad)


def test_serve_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--store`` defaults to the per-user SQLite file (STORE-10); ``--store-ttl`` reads units."""
    import argparse

    from engine.server.process import flags
    from engine.server.process import serve as run
    from engine.settings import duration

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    parser = argparse.ArgumentParser()
    flags.add_serve_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["serve", "--store-ttl", "12h"])
    assert args.store_ttl_s == 12 * 3600
    store = run.response_store(flags.serve_options(args), flags.engine_config(args))
    assert isinstance(store, SqliteStore) and store.ttl_s == 12 * 3600
    assert store.path == tmp_path / "xdg" / "rollout" / "rollout.db" and store.path.parent.is_dir()
    assert duration("30d") == 30 * 86400 and duration("90") == 90
    with pytest.raises(ValueError, match="not a duration"):
        duration("3x")
    with pytest.raises(SystemExit):  # argparse says what is wrong and exits 2
        parser.parse_args(["serve", "--store-ttl", "-1d"])


def test_serve_refuses_a_broken_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from cli.main import main

    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not sqlite" * 100)
    assert main(["serve", "--port", "0", "--store", f"sqlite:///{path}"]) == 2
    assert "file is not a database" in capsys.readouterr().err


async def test_opaque_items_round_trip(store: ResponseStore) -> None:
    """Items kept as sent (ITEM-7) come back exactly, beside typed ones (STORE-4)."""
    from protocol.items import OpaqueItem

    opaque = OpaqueItem({"type": "web_search_call", "id": "ws_1", "status": "completed"})
    context = [_message("search it"), opaque]
    tool = msgspec.Raw(b'{"type":"function","name":"f","parameters":{"type":"object"}}')
    response = msgspec.structs.replace(_response(5), tools=[tool])  # tools kept raw (TOOL-1)
    await store.put(chain_record(response, [context[0]], context, None))
    hydrated = await store.hydrate(response.id)
    assert hydrated is not None and hydrated.items == context
    assert [bytes(t) for t in hydrated.record.response.tools] == [bytes(tool)]


# ------------------------------------------------------------------ head line, owner, salt

ALICE, BOB = "a" * 32, "b" * 32


async def test_owner_is_checked_before_the_body_is_decoded(store: ResponseStore) -> None:
    """OWN-5: a record whose body is garbage but whose head names Alice is None for Bob (get,
    hydrate, delete: nothing changes), corrupt for Alice, removable by Alice or ANY_OWNER."""
    record = chain_record(_response(1), [], [_message("secret")], None, owner=ALICE)
    await store.put(record)
    blob = await store._read_one(record.id)
    assert blob is not None and blob.startswith(b"rr1 L " + ALICE.encode() + b"\n")
    head = peek(blob)
    assert head is not None and (head.owner, head.deleted) == (ALICE, False)
    await store._replace(record.id, blob[: head.body_at] + b"\xc1 garbage")
    assert await store.get(record.id, BOB) is None
    assert await store.hydrate(record.id, BOB) is None
    assert await store.delete(record.id, BOB) is False
    for reader in (ALICE, ANY_OWNER):
        try:
            await store.get(record.id, reader)
        except RecordCorrupt:
            pass
        else:
            raise AssertionError("the owner learns it is corrupt")
    assert await store.delete(record.id, ALICE) is True
    assert await store._read_one(record.id) is None


async def test_a_deleted_record_is_known_from_its_head(store: ResponseStore) -> None:
    """STORE-20: the tombstone's head says D, and ``exists`` reads nothing else."""
    record = chain_record(_response(2), [], [_message("x" * 300_000)], None, owner=ALICE)
    await store.put(record)
    assert await store.exists(record.id) is True
    assert await store.delete(record.id, ALICE) is True
    blob = await store._read_one(record.id)
    assert blob is not None and blob.startswith(b"rr1 D ")
    assert await store.exists(record.id) is False


async def test_records_from_before_the_head_line_still_read(store: ResponseStore) -> None:
    """STORE-20: a record stored as bare JSON (the earlier layout) reads, probes and deletes as
    before, its owner checked from its own field."""
    record = chain_record(_response(3), [], [_message("old")], None, owner=ALICE)
    await store._write(record.id, _ENCODER.encode(record), [], False, None)
    assert await store.exists(record.id) is True
    assert await store.get(record.id, BOB) is None
    got = await store.get(record.id, ALICE)
    assert got is not None and got.owner == ALICE
    assert await store.delete(record.id, BOB) is False
    assert await store.delete(record.id, ALICE) is True
    assert await store.exists(record.id) is False


async def test_the_salt_is_kept_by_the_store(make_store: Factory) -> None:
    """OWN-6: two handles on one store give a key the same digest, and it is not the bare
    sha256 of the key."""
    first, second = make_store(), make_store()
    await first.open()
    await second.open()
    try:
        digest = await first.owner_of("sk-key")
        assert digest == await second.owner_of("sk-key")
        assert digest != hashlib.sha256(b"sk-key").hexdigest()[:32]
        assert digest != await first.owner_of("sk-other")
    finally:
        await first.close()
        await second.close()


async def test_each_store_has_its_own_salt(tmp_path: Path, redis_server: RedisServer) -> None:
    """OWN-6: the same key gets a different digest in every store, of every kind."""
    stores: list[ResponseStore] = [
        MemoryStore(),
        MemoryStore(),
        SqliteStore(tmp_path / "one.db"),
        SqliteStore(tmp_path / "two.db"),
        RedisStore(redis_server.url),
    ]
    digests = set()
    for each in stores:
        await each.open()
        try:
            digests.add(await each.owner_of("sk-key"))
        finally:
            await each.close()
    assert len(digests) == len(stores)


async def test_a_store_from_before_the_salt_gets_one(tmp_path: Path) -> None:
    """OWN-6 migration: a schema-1 SQLite file (no ``meta`` table) is migrated at open, and the
    salt created then is the one every later open reads."""
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        conn.execute("INSERT INTO schema_version VALUES (1)")
        conn.execute(
            "CREATE TABLE responses (id TEXT PRIMARY KEY, record BLOB NOT NULL,"
            " created_at REAL NOT NULL, expires_at REAL)"
        )
    digests = []
    for _ in range(2):
        opened = SqliteStore(path)
        await opened.open()
        try:
            digests.append(await opened.owner_of("sk-key"))
        finally:
            await opened.close()
    assert digests[0] == digests[1]
    with sqlite3.connect(path) as conn:
        (salt,) = conn.execute("SELECT value FROM meta WHERE key = 'owner_salt'").fetchone()
    assert len(salt) == 16
