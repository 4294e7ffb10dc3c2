"""The node-to-node routes trust nobody (PARK-22, LIVE-2, LIVE-8), asked directly on a node's own
port, never through a balancer (whose own 403 would hide the node's): a real keyed server on an
ephemeral loopback port, plain aiohttp as the other "node".

The walk reads the app's route table, so a ``/cluster/`` route added later is sent the same
refusals without an entry here. Each route is sent its request with no token (and no API key)
and with a wrong token (and a valid API key): 403 ``forbidden`` in the error envelope, counted
as refused, and nothing done: the background run named still runs, the parked rollout named is
still parked. A valid token then opens each (so the 403 was the token's). With a valid token
naming another owner, the running node's own owner check answers 404 and the run runs on."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI

from engine.core import EngineConfig
from engine.retained.handover import HANDOVER_PATH, TOKEN_HEADER, token_message
from engine.server.transport.node import CANCEL_PATH, EVENTS_PATH, IDEM_FOLLOW_PATH
from engine.server.transport.server_config import ServerConfig
from tests.support.server import LiveServer, start_server
from tests.support.tools import WEATHER
from tests.support.wait import wait_for

KEY, OTHER_KEY = "sk-node-routes-a", "sk-node-routes-b"
LONG = " ".join(f"word{n}" for n in range(40))  # the simulator answers ~45 tokens
UNFINISHED = ("queued", "in_progress")  # it runs on: neither cancelled nor ended
FORBIDDEN = {  # ERR-2's HTTP body
    "error": {
        "type": "invalid_request_error",
        "code": "forbidden",
        "message": "Not a node of this cluster.",
        "param": None,
    },
}


@pytest.fixture
async def node() -> AsyncIterator[LiveServer]:
    """One keyed node whose simulator samples 5 tokens a second: a run lasts seconds."""
    keyed = ServerConfig(api_keys=frozenset({KEY, OTHER_KEY}))
    live = await start_server(EngineConfig(tokens_per_second=5), server=keyed)
    try:
        yield live
    finally:
        await live.runner.cleanup()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def _root(live: LiveServer) -> str:
    return f"http://127.0.0.1:{live.port}"


async def _token(live: LiveServer, response_id: str, owner: str | None, purpose: str) -> str:
    """What a node sharing this node's store would send (PARK-22's HMAC)."""
    return await live.engine.store.cluster.node_token(token_message(response_id, owner, purpose))


async def _background_run(live: LiveServer) -> str:
    async with AsyncOpenAI(base_url=live.base_url, api_key=KEY, max_retries=0) as sdk:
        created = await sdk.responses.create(model="sim", input=LONG, background=True)
    assert created.status == "queued"
    return created.id


async def _parked_rollout(live: LiveServer) -> str:
    """A WebSocket create that ends on a tool call, then the socket closes: parked here."""
    sdk = AsyncOpenAI(base_url=live.base_url, api_key=KEY, max_retries=0)
    async with sdk, sdk.responses.connect() as conn:
        await conn.response.create(model="sim", input="Weather?", tools=[WEATHER], store=False)
        async for event in conn:
            if event.type == "response.completed":
                response_id: str = event.response.id
                break
    await wait_for(lambda: len(live.engine.parking) == 1, "the rollout parked")
    return response_id


async def _status(live: LiveServer, http: aiohttp.ClientSession, response_id: str) -> str:
    headers = {"Authorization": f"Bearer {KEY}"}
    async with http.get(f"{live.base_url}/responses/{response_id}", headers=headers) as resp:
        assert resp.status == 200
        status: str = (await resp.json())["status"]
        return status


def _bodies(run_id: str, parked_id: str, owner: str) -> dict[str, dict[str, Any]]:
    """What each node route is asked, naming live state of ``owner`` on this node."""
    return {
        HANDOVER_PATH: {"response_id": parked_id, "owner": owner},
        CANCEL_PATH: {"response_id": run_id, "owner": owner},
        EVENTS_PATH: {"response_id": run_id, "owner": owner, "starting_after": -1},
        IDEM_FOLLOW_PATH: {"response_id": f"{owner}:an-idempotency-key", "kind": "idem"},
    }


async def test_every_node_route_refuses_a_missing_or_wrong_token(
    node: LiveServer, http: aiohttp.ClientSession
) -> None:
    """PARK-22, LIVE-2, LIVE-8: every ``/cluster/`` route of the app, asked directly on the
    node with no token (no API key either) or a wrong one (with a valid API key), is 403
    ``forbidden`` in the error envelope and does nothing: the run is not cancelled nor followed,
    the rollout stays parked. The same requests with a valid token are served."""
    routes = sorted(
        (r.method, r.resource.canonical)
        for r in node.runner.app.router.routes()
        if r.resource is not None and r.resource.canonical.startswith("/cluster/")
    )
    assert {path for _, path in routes} >= {HANDOVER_PATH, CANCEL_PATH, EVENTS_PATH}
    run_id, parked_id = await _background_run(node), await _parked_rollout(node)
    owner = await node.engine.store.owner_of(KEY)
    bodies = _bodies(run_id, parked_id, owner)
    refusals = [{}, {"Authorization": f"Bearer {KEY}", TOKEN_HEADER: "0" * 64}]
    for method, path in routes:
        body = bodies.get(path, {"response_id": run_id, "owner": owner})
        for headers in refusals:
            async with http.request(method, _root(node) + path, json=body, headers=headers) as r:
                assert (r.status, await r.json()) == (403, FORBIDDEN), (path, headers)
    counters = node.engine.counters
    node_runs = sum(p != HANDOVER_PATH for _, p in routes)
    assert counters["runs.remote_refused"] == len(refusals) * node_runs
    assert counters["park.handover_refused"] == len(refusals)
    assert counters["runs.remote_cancelled"] == counters["runs.remote_followed"] == 0
    assert await _status(node, http, run_id) in UNFINISHED  # not cancelled
    assert len(node.engine.parking) == 1  # not handed over
    # The token was all that was missing: a valid one opens each route.
    claimed = {TOKEN_HEADER: await _token(node, parked_id, owner, "handover")}
    async with http.post(_root(node) + HANDOVER_PATH, json=bodies[HANDOVER_PATH], headers=claimed):
        assert len(node.engine.parking) == 0
    token = {TOKEN_HEADER: await _token(node, run_id, owner, "run")}
    async with http.post(_root(node) + EVENTS_PATH, json=bodies[EVENTS_PATH], headers=token) as r:
        assert r.status == 200 and r.content_type == "text/event-stream"
        assert (await r.content.readline()).startswith(b"event: response.created")
    async with http.post(_root(node) + CANCEL_PATH, json=bodies[CANCEL_PATH], headers=token) as r:
        assert (r.status, (await r.json())["status"]) == (200, "cancelled")
    assert counters["runs.remote_cancelled"] == counters["runs.remote_followed"] == 1


async def test_the_running_node_checks_the_owner_itself(
    node: LiveServer, http: aiohttp.ClientSession
) -> None:
    """LIVE-2, OWN-2: a valid node token naming another owner (another key's digest) opens
    the route, and the running node's own owner check answers 404: the cancel cancels nothing,
    the follow streams nothing. A token names one run, one owner and one purpose: one made for
    the owner's own cancel does not open another owner's, nor an ``any_owner`` (operator)
    request. The run runs on, and its owner's cancel (the control) still cancels it."""
    run_id = await _background_run(node)
    owner = await node.engine.store.owner_of(KEY)
    other = await node.engine.store.owner_of(OTHER_KEY)
    assert owner != other
    theirs = {TOKEN_HEADER: await _token(node, run_id, other, "run")}
    extras: list[tuple[str, dict[str, Any]]] = [
        (CANCEL_PATH, {}),
        (EVENTS_PATH, {"starting_after": -1}),
    ]
    for path, extra in extras:
        theirs_body = {"response_id": run_id, "owner": other, **extra}
        async with http.post(_root(node) + path, json=theirs_body, headers=theirs) as r:
            assert r.status == 404, path
            assert (await r.json())["error"]["code"] == "not_found"
    mine = {TOKEN_HEADER: await _token(node, run_id, owner, "run")}
    forged: list[dict[str, Any]] = [
        {"response_id": run_id, "owner": other},  # the token is the owner's, not theirs
        {"response_id": run_id, "owner": owner, "any_owner": True},  # "run-any" is another
    ]
    for body in forged:
        async with http.post(_root(node) + CANCEL_PATH, json=body, headers=mine) as r:
            assert (r.status, await r.json()) == (403, FORBIDDEN), body
    counters = node.engine.counters
    assert counters["runs.remote_cancelled"] == counters["runs.remote_followed"] == 0
    assert await _status(node, http, run_id) in UNFINISHED
    body = {"response_id": run_id, "owner": owner}
    async with http.post(_root(node) + CANCEL_PATH, json=body, headers=mine) as r:
        assert (r.status, (await r.json())["status"]) == (200, "cancelled")
