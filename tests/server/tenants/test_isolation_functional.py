"""Tenant isolation on a real server with three keys (issue 17 §1): the inspector feed is scoped
per key (INSP-9), a corrupt record answers another key as an unknown id and only its owner or
an operator may delete it (OWN-5), and owner digests are salted per store (OWN-6)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from engine.server.transport.server_config import ServerConfig
from engine.store.embedded.sqlite import SqliteStore
from engine.store.framing import peek
from tests.store._chain import body, ws_create
from tests.support.server import LiveServer, start_server

KEY_A, KEY_B, OPERATOR = "sk-tenant-a", "sk-tenant-b", "sk-operator"


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
async def keyed(tmp_path: Path) -> AsyncIterator[LiveServer]:
    config = ServerConfig(api_keys=frozenset({KEY_A, KEY_B}), admin_keys=frozenset({OPERATOR}))
    live = await start_server(store=SqliteStore(tmp_path / "iso.db"), server=config)
    try:
        yield live
    finally:
        await live.runner.cleanup()


def root(live: LiveServer) -> str:
    return f"http://127.0.0.1:{live.port}"


async def snapshot(http: aiohttp.ClientSession, live: LiveServer, key: str) -> dict[str, Any]:
    """The first snapshot that lists the connections open now (the feed samples at 2 Hz)."""
    url = f"ws://127.0.0.1:{live.port}/inspect/feed"
    async with http.ws_connect(url, headers=auth(key)) as feed:
        while True:
            message = await feed.receive_json(timeout=10)
            if message["type"] == "snapshot" and message["totals"]["suspended"] >= 0:
                return message


async def turns(http: aiohttp.ClientSession, live: LiveServer, key: str, rid: str) -> Any:
    url = f"ws://127.0.0.1:{live.port}/inspect/feed"
    async with http.ws_connect(url, headers=auth(key)) as feed:
        await feed.send_json({"type": "turns", "rollout_id": rid})
        while (message := await feed.receive_json(timeout=10))["type"] == "snapshot":
            pass
        return message


async def test_inspector_feed_shows_each_key_only_its_own(keyed: LiveServer) -> None:
    """INSP-9: key B's feed lists none of key A's connections, rollouts or response ids, and
    A's rollout's turns are not found for B; the operator key sees both."""
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(keyed.ws_url, headers=auth(KEY_A)) as ws_a,
        http.ws_connect(keyed.ws_url, headers=auth(KEY_B)) as ws_b,
    ):
        secret = (await ws_create(ws_a, body(None, 0))).response
        mine = (await ws_create(ws_b, body(None, 1))).response
        assert secret is not None and mine is not None
        seen_by = {key: await snapshot(http, keyed, key) for key in (KEY_A, KEY_B, OPERATOR)}
        ids = {
            key: {row["response_id"] for row in snap["rollouts"]} for key, snap in seen_by.items()
        }
        assert ids[KEY_B] == {mine["id"]}, "B sees only its own rollout"
        assert ids[KEY_A] == {secret["id"]}
        assert ids[OPERATOR] == {secret["id"], mine["id"]}
        assert seen_by[KEY_B]["totals"]["connections"] == 1
        assert seen_by[OPERATOR]["totals"]["connections"] == 2
        assert secret["id"] not in str(seen_by[KEY_B])
        rollout_a = next(
            row["id"] for row in seen_by[OPERATOR]["rollouts"]
            if row["response_id"] == secret["id"]
        )  # fmt: skip
        assert (await turns(http, keyed, KEY_B, rollout_a))["found"] is False
        assert (await turns(http, keyed, KEY_A, rollout_a))["found"] is True
        assert (await turns(http, keyed, OPERATOR, rollout_a))["found"] is True


async def test_recent_errors_are_shown_to_their_key(keyed: LiveServer) -> None:
    """INSP-9: an error of B's request is on B's feed and the operator's, never on A's; one
    whose key is unknown (a refused key) only on the operator's."""
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(keyed.ws_url, headers=auth(KEY_B)) as ws_b:
            reply = await ws_create(ws_b, {"input": "x", "previous_response_id": "resp_b_gone"})
            assert reply.code == "previous_response_not_found"
        async with http.get(f"{root(keyed)}/v1/responses/resp_a_gone", headers=auth(KEY_A)) as r:
            assert r.status == 404
        async with http.get(f"{root(keyed)}/v1/models", headers=auth("sk-wrong")) as resp:
            assert resp.status == 401
        codes = {}
        for key in (KEY_A, KEY_B, OPERATOR):
            codes[key] = {note["code"] for note in (await snapshot(http, keyed, key))["errors"]}
    assert codes[KEY_B] == {"previous_response_not_found"}
    assert codes[KEY_A] == {"response_not_found"}
    assert {"previous_response_not_found", "response_not_found", "invalid_api_key"} <= codes[
        OPERATOR
    ]


async def _corrupt_body(live: LiveServer, rid: str) -> None:
    """Keep the record's head line (its owner), break everything after it."""
    store = live.engine.store
    blob = await store._read_one(rid)
    assert blob is not None
    head = peek(blob)
    assert head is not None and head.owner is not None
    await store._replace(rid, blob[: head.body_at] + b"\xc1\xc1 not json")


async def _not_found_answers(
    http: aiohttp.ClientSession, live: LiveServer, key: str, rid: str
) -> list[tuple[int, Any]]:
    """Every answer ``key`` gets for ``rid``, with the id taken out so that an unknown id's
    answers compare equal."""
    out: list[tuple[int, Any]] = []
    base = f"{root(live)}/v1/responses"
    for method, path in (
        ("GET", f"{base}/{rid}"),
        ("GET", f"{base}/{rid}/input_items"),
        ("POST", f"{base}/{rid}/cancel"),
    ):
        async with http.request(method, path, headers=auth(key)) as resp:
            out.append((resp.status, (await resp.text()).replace(rid, "<id>")))
    reply = await http_create_as(http, live, key, {"input": "x", "previous_response_id": rid})
    out.append((reply[0], reply[1].replace(rid, "<id>")))
    async with http.ws_connect(live.ws_url, headers=auth(key)) as ws:
        answer = await ws_create(ws, {"input": "x", "previous_response_id": rid})
        out.append((answer.status, str(answer.error).replace(rid, "<id>")))
    return out


async def http_create_as(
    http: aiohttp.ClientSession, live: LiveServer, key: str, payload: dict[str, Any]
) -> tuple[int, str]:
    url = f"{root(live)}/v1/responses"
    async with http.post(url, json={"model": "sim", **payload}, headers=auth(key)) as resp:
        return resp.status, await resp.text()


async def test_corrupt_record_is_unknown_to_another_key(keyed: LiveServer) -> None:
    """OWN-5: B's answers for A's corrupt record are exactly B's answers for an unknown id; B's
    DELETE changes nothing; A gets store_record_corrupt; the operator key deletes it."""
    async with aiohttp.ClientSession() as http:
        created = await http_create_as(http, keyed, KEY_A, {"input": "my secret"})
        assert created[0] == 200
        rid = json.loads(created[1])["id"]
        await _corrupt_body(keyed, rid)
        unknown = await _not_found_answers(http, keyed, KEY_B, "resp_0123456789abcdef")
        assert await _not_found_answers(http, keyed, KEY_B, rid) == unknown
        assert [status for status, _ in unknown] == [404, 404, 404, 400, 400]
        async with http.delete(f"{root(keyed)}/v1/responses/{rid}", headers=auth(KEY_B)) as resp:
            assert resp.status == 404
        async with http.get(f"{root(keyed)}/v1/responses/{rid}", headers=auth(KEY_A)) as resp:
            assert resp.status == 500  # the owner learns it is corrupt (STORE-9)
            assert (await resp.json())["error"]["code"] == "store_record_corrupt"
        async with http.delete(f"{root(keyed)}/v1/responses/{rid}", headers=auth(OPERATOR)) as resp:
            assert resp.status == 200
        async with http.get(f"{root(keyed)}/v1/responses/{rid}", headers=auth(KEY_A)) as resp:
            assert resp.status == 404


async def test_unreadable_record_is_nobodys_but_the_operators(keyed: LiveServer) -> None:
    """OWN-5: a blob whose owner cannot be read answers every key as unknown; only an operator
    key may delete it."""
    await keyed.engine.store._write("resp_garbage", b"\xc1\xc1", [], False, None)
    async with aiohttp.ClientSession() as http:
        for key in (KEY_A, KEY_B):
            url = f"{root(keyed)}/v1/responses/resp_garbage"
            async with http.get(url, headers=auth(key)) as resp:
                assert resp.status == 404
            async with http.delete(url, headers=auth(key)) as resp:
                assert resp.status == 404
        async with http.delete(
            f"{root(keyed)}/v1/responses/resp_garbage", headers=auth(OPERATOR)
        ) as resp:
            assert resp.status == 200
    assert await keyed.engine.store._read_one("resp_garbage") is None


async def test_owner_digest_is_salted_per_store(keyed: LiveServer, tmp_path: Path) -> None:
    """OWN-6: the stored owner is not the bare sha256 of the key, and another store gives the
    same key another digest."""
    async with aiohttp.ClientSession() as http:
        created = await http_create_as(http, keyed, KEY_A, {"input": "hi"})
    rid = json.loads(created[1])["id"]
    record = await keyed.engine.store.get(rid)
    assert record is not None and record.owner is not None
    assert record.owner != hashlib.sha256(KEY_A.encode()).hexdigest()[:32]
    assert record.owner == await keyed.engine.store.owner_of(KEY_A)
    other = SqliteStore(tmp_path / "other.db")
    await other.open()
    try:
        assert await other.owner_of(KEY_A) != record.owner
    finally:
        await other.close()


async def test_conversations_stay_with_their_key(keyed: LiveServer) -> None:
    """CONV-2 with two tenants on one server: each key's conversation holds only its own turns;
    B naming A's conversation (a create, its items) gets not-found without touching A's lock,
    its cached context or its items; an operator key is no owner of A's conversation."""
    async with aiohttp.ClientSession() as http:
        base = f"{root(keyed)}/v1"
        convs = {}
        for key in (KEY_A, KEY_B):
            async with http.post(f"{base}/conversations", json={}, headers=auth(key)) as resp:
                convs[key] = (await resp.json())["id"]
            payload = {"model": "sim", "input": f"secret of {key}", "conversation": convs[key]}
            async with http.post(f"{base}/responses", json=payload, headers=auth(key)) as resp:
                assert resp.status == 200, await resp.text()
        hits = keyed.engine.counters["hydration.hit"]
        stolen = {"model": "sim", "input": "x", "conversation": convs[KEY_A]}
        for key in (KEY_B, OPERATOR):
            async with http.post(f"{base}/responses", json=stolen, headers=auth(key)) as resp:
                assert resp.status == 404
            url = f"{base}/conversations/{convs[KEY_A]}/items"
            async with http.get(url, headers=auth(key)) as resp:
                assert resp.status == 404
        assert keyed.engine.counters["hydration.hit"] == hits  # A's cached context unread
        for key, other in ((KEY_A, KEY_B), (KEY_B, KEY_A)):
            url = f"{base}/conversations/{convs[key]}/items?order=asc"
            async with http.get(url, headers=auth(key)) as resp:
                texts = json.dumps(await resp.json())
            assert f"secret of {key}" in texts and f"secret of {other}" not in texts
        again = {"model": "sim", "input": "more", "conversation": convs[KEY_A]}
        async with http.post(f"{base}/responses", json=again, headers=auth(KEY_A)) as resp:
            assert resp.status == 200, await resp.text()  # nothing B did left it locked
