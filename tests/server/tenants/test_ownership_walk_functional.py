"""OWN-2 over everything that takes a response id, driven by the app's route table and the
client event union: a route or a WebSocket event added without an entry here fails the walk,
and every entry is called as key B with key A's ids and must answer exactly what B gets for an
id that never existed (HTTP 404 ``response_not_found``, or 400 ``previous_response_not_found``
where OpenAI answers so). Afterwards A finds everything as it was."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest

from engine.server.transport.server_config import ServerConfig
from engine.store.conversations import Conversations
from engine.store.embedded.sqlite import SqliteStore
from engine.store.framing import peek
from protocol.events import ClientEvent
from tests.store._chain import TOOL, body
from tests.support.server import LiveServer, start_server

KEY_A, KEY_B = "sk-walk-a", "sk-walk-b"
UNKNOWN = "resp_00000000000000000000000000000000"
Call = Callable[[aiohttp.ClientSession, str, str], Awaitable[tuple[int, str]]]


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _path(base: str, template: str, rid: str, query: str = "") -> str:
    return base + template.replace("{response_id}", rid) + query


def by_path(method: str, template: str, query: str = "") -> Call:
    async def call(http: aiohttp.ClientSession, base: str, rid: str) -> tuple[int, str]:
        url = _path(base, template, rid, query)
        async with http.request(method, url, headers=auth(KEY_B)) as resp:
            return resp.status, await resp.text()

    return call


def by_body(template: str, **extra: Any) -> Call:
    async def call(http: aiohttp.ClientSession, base: str, rid: str) -> tuple[int, str]:
        payload = {"model": "sim", "input": "x", "previous_response_id": rid, **extra}
        async with http.post(base + template, json=payload, headers=auth(KEY_B)) as resp:
            return resp.status, await resp.text()

    return call


# Every route of the app, by (method, path): how key B names a response id on it, or None for
# a route that takes none. Several calls per route where the id can arrive on several paths.
ID = "/v1/responses/{response_id}"
ROUTES: dict[tuple[str, str], list[Call] | None] = {
    ("GET", "/v1/responses"): None,  # the WebSocket: walked by its events below
    ("POST", "/v1/responses"): [
        by_body("/v1/responses"),
        by_body("/v1/responses", stream=True),
        by_body("/v1/responses", background=True),
        by_body("/v1/responses", store=False),
    ],
    ("POST", "/v1/responses/compact"): [by_body("/v1/responses/compact")],
    ("POST", "/v1/responses/input_tokens"): [by_body("/v1/responses/input_tokens")],
    ("GET", ID): [by_path("GET", ID), by_path("GET", ID, "?stream=true")],
    ("HEAD", ID): [by_path("HEAD", ID)],
    ("DELETE", ID): [by_path("DELETE", ID)],
    ("POST", ID + "/cancel"): [by_path("POST", ID + "/cancel")],
    ("GET", ID + "/input_items"): [by_path("GET", ID + "/input_items")],
    ("GET", ID + "/tokens"): [by_path("GET", ID + "/tokens")],  # TOK-8
    ("HEAD", ID + "/tokens"): [by_path("HEAD", ID + "/tokens")],
    ("HEAD", ID + "/input_items"): [by_path("HEAD", ID + "/input_items")],
    # Names no id: scoped per key (EXPORT-1), tests/upstream/tokens/test_tokens_export.py.
    ("GET", "/v1/responses/tokens/export"): None,
    ("HEAD", "/v1/responses/tokens/export"): None,
    ("HEAD", "/v1/responses"): None,
    # Node to node only (refused by the balancers, CLUSTER-12): a node token bound to the id and
    # the asking owner, and the parking node hands over only to that owner (PARK-22);
    # tests/cluster/continuations/test_parked_across_nodes.py.
    ("POST", "/cluster/v1/handover"): None,
    # Node to node only too: the token binds the run and the owner, and the running node checks
    # the owner (LIVE-2); tests/cluster/continuations/test_background_across_nodes.py.
    ("POST", "/cluster/v1/runs/cancel"): None,
    ("POST", "/cluster/v1/runs/events"): None,
    ("POST", "/cluster/v1/idempotent/follow"): None,  # the scope holds the owner (LIVE-8)
    ("GET", "/v1/models"): None,
    ("HEAD", "/v1/models"): None,
    ("GET", "/healthz"): None,
    ("HEAD", "/healthz"): None,
    ("GET", "/debug/stats"): None,
    ("HEAD", "/debug/stats"): None,
    ("GET", "/metrics"): None,
    ("HEAD", "/metrics"): None,
    ("GET", "/inspect"): None,  # the page: no data in it
    ("POST", "/inspect/login"): None,  # the inspector's sign-in form (AUTH-13)
    ("POST", "/inspect/logout"): None,  # sign-out: revokes the cookie's session (AUTH-14)
    ("HEAD", "/inspect"): None,
    ("GET", "/inspect/feed"): None,  # scoped per key: INSP-9, tests/server/test_isolation_*
    ("HEAD", "/inspect/feed"): None,
}

# The Conversations API (CONV-2): every route names a conversation, walked by
# ``test_every_conversation_route_answers_another_key_as_unknown`` below with key A's
# conversation ids (and one of A's item ids) as key B.
CONV = "/v1/conversations/{conversation_id}"
CONV_ROUTES: dict[tuple[str, str], list[tuple[str, str, dict[str, Any] | None]]] = {
    ("POST", "/v1/conversations"): [],  # names none: makes B's own
    ("GET", CONV): [("GET", CONV, None)],
    ("HEAD", CONV): [("HEAD", CONV, None)],
    ("POST", CONV): [("POST", CONV, {"metadata": {"k": "v"}})],
    ("DELETE", CONV): [("DELETE", CONV, None)],
    ("GET", CONV + "/items"): [("GET", CONV + "/items", None)],
    ("HEAD", CONV + "/items"): [("HEAD", CONV + "/items", None)],
    ("POST", CONV + "/items"): [
        ("POST", CONV + "/items", {"items": [{"role": "user", "content": "x"}]})
    ],
    ("GET", CONV + "/items/{item_id}"): [("GET", CONV + "/items/{item_id}", None)],
    ("HEAD", CONV + "/items/{item_id}"): [("HEAD", CONV + "/items/{item_id}", None)],
    ("DELETE", CONV + "/items/{item_id}"): [("DELETE", CONV + "/items/{item_id}", None)],
}
UNKNOWN_CONV = "conv_" + "0" * 32

# Every client event that names a response id: a payload around the id.
EVENTS: dict[str, Callable[[str], dict[str, Any]]] = {
    "response.create": lambda rid: {"model": "sim", "input": "x", "previous_response_id": rid},
    "response.append": lambda rid: {"response_id": rid, "input": []},
    "response.inject": lambda rid: {"response_id": rid, "input": []},
    "response.steer": lambda rid: {"previous_response_id": rid, "input": "x"},
    # Never answered, for any id (WS-15): the walk checks that nothing comes back.
    "response.processed": lambda rid: {"response_id": rid},
}
SILENT = {"response.processed"}
PROBE = {"type": "rollout.walk_probe"}  # an unknown event: answered at once with an error


def _route_table(live: LiveServer) -> set[tuple[str, str]]:
    return {
        (route.method, route.resource.canonical)
        for route in live.runner.app.router.routes()
        if route.resource is not None
    }


def _events_with_ids() -> set[str]:
    """The client events whose fields name a response id, read from the union itself."""
    tagged: set[str] = set()
    for kind in ClientEvent.__args__:
        info = msgspec.inspect.type_info(kind)
        assert isinstance(info, msgspec.inspect.StructType)
        if any(field.name.endswith("response_id") for field in info.fields):
            tagged.add(str(info.tag))
    return tagged


@pytest.fixture
async def keyed(tmp_path: Path) -> AsyncIterator[LiveServer]:
    config = ServerConfig(api_keys=frozenset({KEY_A, KEY_B}))
    live = await start_server(store=SqliteStore(tmp_path / "walk.db"), server=config)
    try:
        yield live
    finally:
        await live.runner.cleanup()


async def _a_ids(http: aiohttp.ClientSession, base: str) -> list[str]:
    """Key A's ids of every kind: stored, background, store=false-on-a-live-socket is not
    reachable over HTTP, so a stored tool call (its rollout suspended) stands for it."""
    ids = []
    for extra in ({}, {"background": True}, {"tools": [TOOL]}):
        payload = {"model": "sim", "input": "lookup the weather", **extra}
        async with http.post(f"{base}/v1/responses", json=payload, headers=auth(KEY_A)) as resp:
            assert resp.status == 200, await resp.text()
            ids.append((await resp.json())["id"])
    return ids


async def _corrupt_copy(live: LiveServer, rid: str) -> str:
    """A record of A's whose body cannot be decoded: A's head line, then garbage."""
    store = live.engine.store
    blob = await store._read_one(rid)
    head = peek(blob) if blob is not None else None
    assert blob is not None and head is not None and head.owner is not None
    await store._write("resp_corrupt_of_a", blob[: head.body_at] + b"\xc1\xc1", [], False, None)
    return "resp_corrupt_of_a"


def _same(answer: tuple[int, str], rid: str) -> tuple[int, str]:
    status, text = answer
    return status, text.replace(rid, UNKNOWN)


async def _ws_answer(ws: aiohttp.ClientWebSocketResponse, event: dict[str, Any]) -> str:
    await ws.send_str(json.dumps(event))
    if event["type"] in SILENT:  # whatever it says comes before the probe's own error
        await ws.send_str(json.dumps(PROBE))
        first = json.loads((await ws.receive(timeout=30)).data)
        assert first["type"] == "error" and "rollout.walk_probe" in first["error"]["message"]
        return "silent"
    while True:
        message = json.loads((await ws.receive(timeout=30)).data)
        if message["type"] == "error" or message["type"].endswith(".failed"):
            message.pop("sequence_number", None)
            return json.dumps(message, sort_keys=True)
        assert message["type"] not in ("response.completed", "response.created"), message


async def test_every_route_and_event_answers_another_key_as_unknown(keyed: LiveServer) -> None:
    """OWN-2 over the route table and the client event union."""
    assert _route_table(keyed) == set(ROUTES) | set(CONV_ROUTES), "classify the new route"
    assert _events_with_ids() == set(EVENTS), "add the new id-taking event to EVENTS"
    base = f"http://127.0.0.1:{keyed.port}"
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(keyed.ws_url, headers=auth(KEY_A)) as ws_a:
            # A's live socket: a suspended rollout, as append/inject/steer target.
            await ws_a.send_str(json.dumps({"type": "response.create", **body(None, 0)}))
            while (live := json.loads((await ws_a.receive(timeout=30)).data))["type"] != (
                "response.completed"
            ):
                pass
            ids = [*await _a_ids(http, base), live["response"]["id"]]
            corrupt = await _corrupt_copy(keyed, ids[0])  # A's, and unreadable (OWN-5)
            ids.append(corrupt)
            calls = [c for entry in ROUTES.values() if entry for c in entry]
            for call in calls:
                unknown = await call(http, base, UNKNOWN)
                assert unknown[0] in (400, 404), unknown
                for rid in ids:
                    assert _same(await call(http, base, rid), rid) == unknown, (call, rid)
            async with http.ws_connect(keyed.ws_url, headers=auth(KEY_B)) as ws_b:
                for kind, make in EVENTS.items():
                    unknown_ws = await _ws_answer(ws_b, {"type": kind, **make(UNKNOWN)})
                    for rid in ids:
                        answer = await _ws_answer(ws_b, {"type": kind, **make(rid)})
                        assert answer.replace(rid, UNKNOWN) == unknown_ws, (kind, rid)
        for rid in ids:  # nothing B did changed anything for A
            async with http.get(f"{base}/v1/responses/{rid}", headers=auth(KEY_A)) as resp:
                assert resp.status == (500 if rid == corrupt else 200), await resp.text()


async def _conv_call(
    http: aiohttp.ClientSession,
    base: str,
    entry: tuple[str, str, dict[str, Any] | None],
    conv: str,
    item: str,
) -> tuple[int, str]:
    method, template, payload = entry
    url = base + template.replace("{conversation_id}", conv).replace("{item_id}", item)
    async with http.request(method, url, json=payload, headers=auth(KEY_B)) as resp:
        return resp.status, (await resp.text()).replace(conv, UNKNOWN_CONV)


async def _corrupt_conversation(live: LiveServer, conv: str) -> str:
    """A conversation of A's whose body cannot be decoded: A's head line, then garbage."""
    store = live.engine.store
    blob = await store._read_one(conv)
    head = peek(blob) if blob is not None else None
    assert blob is not None and head is not None and head.owner is not None
    corrupt = "conv_" + "c" * 32
    await store._write(corrupt, blob[: head.body_at] + b"\xc1\xc1", [], False, None)
    return corrupt


async def test_every_conversation_route_answers_another_key_as_unknown(keyed: LiveServer) -> None:
    """OWN-2, CONV-2 over the conversation routes and ``conversation`` on a create (HTTP, SSE,
    background, WebSocket): key B naming A's conversations (live, with a response, locked by a
    response in progress, corrupt) gets exactly the unknown-id answer, never a 409, and A's
    conversations are unchanged afterwards."""
    base = f"http://127.0.0.1:{keyed.port}"
    async with aiohttp.ClientSession() as http:
        convs = []
        for _ in range(2):
            secret = {"items": [{"role": "user", "content": "a's secret"}]}
            async with http.post(f"{base}/v1/conversations", json=secret, headers=auth(KEY_A)) as r:
                assert r.status == 200, await r.text()
                convs.append((await r.json())["id"])
        create = {"model": "sim", "input": "hi", "conversation": convs[0]}
        async with http.post(f"{base}/v1/responses", json=create, headers=auth(KEY_A)) as resp:
            assert resp.status == 200, await resp.text()
        url = f"{base}/v1/conversations/{convs[0]}/items?order=asc"
        async with http.get(url, headers=auth(KEY_A)) as resp:
            before = await resp.json()
        item = before["data"][0]["id"]
        owner_a = await keyed.engine.store.owner_of(KEY_A)
        held = await Conversations(keyed.engine.store).open(convs[1], owner_a)  # "in progress"
        assert held is not None
        convs.append(await _corrupt_conversation(keyed, convs[0]))
        entries = [entry for calls in CONV_ROUTES.values() for entry in calls]
        for entry in entries:
            unknown = await _conv_call(http, base, entry, UNKNOWN_CONV, item)
            assert unknown[0] == 404, unknown
            for conv in convs:
                assert await _conv_call(http, base, entry, conv, item) == unknown, (entry, conv)
        for extra in ({}, {"stream": True}, {"background": True}, {"store": False}):
            answers = []
            for conv in [UNKNOWN_CONV, *convs]:
                payload: dict[str, Any] = {"model": "sim", "input": "x", "conversation": conv}
                payload.update(extra)
                async with http.post(
                    f"{base}/v1/responses", json=payload, headers=auth(KEY_B)
                ) as r:
                    answers.append((r.status, (await r.text()).replace(conv, UNKNOWN_CONV)))
            assert answers[0][0] == 404 and set(answers) == {answers[0]}, (extra, answers)
        async with http.ws_connect(keyed.ws_url, headers=auth(KEY_B)) as ws_b:

            def make(conv: str) -> dict[str, Any]:
                return {"model": "sim", "input": "x", "conversation": {"id": conv}}

            unknown_ws = await _ws_answer(ws_b, {"type": "response.create", **make(UNKNOWN_CONV)})
            assert '"status": 404' in unknown_ws
            for conv in convs:
                answer = await _ws_answer(ws_b, {"type": "response.create", **make(conv)})
                assert answer.replace(conv, UNKNOWN_CONV) == unknown_ws, conv
        await held.lock.release()
        async with http.get(url, headers=auth(KEY_A)) as resp:
            assert await resp.json() == before  # nothing B did changed A's conversation
        async with http.get(f"{base}/v1/conversations/{convs[1]}", headers=auth(KEY_A)) as resp:
            assert resp.status == 200
