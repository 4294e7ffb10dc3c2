"""The node-to-node protocol's version (LIVE-10), asked directly on a real node's port (plain
aiohttp as the other "node", holding a valid node token, so what answers is the version rule):
a request without the version header is the release before versions and is answered in its
format, byte for byte; version 2 gets version 2's; a newer asker gets this node's own; an asker
older than the accepted range, or one whose version is no number, is refused 409
``node_protocol_unsupported`` in the error envelope with nothing done. Every answer says its
version."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import msgspec
import pytest
from openai import AsyncOpenAI

from engine.core import EngineConfig
from engine.retained.handover import (
    HANDOVER_PATH,
    MSGPACK,
    NODE_PROTOCOL,
    NODE_PROTOCOL_ACCEPTED,
    TOKEN_HEADER,
    VERSION_HEADER,
    PackedAnswer,
    answering,
    readable,
    spoken,
    token_message,
)
from engine.server.transport.node import CANCEL_PATH
from engine.server.transport.server_config import ServerConfig
from engine.store.record_codec import decode_items, encode_items
from tests.support.server import LiveServer, start_server
from tests.support.tools import WEATHER
from tests.support.wait import wait_for

KEY = "sk-node-protocol"
LONG = " ".join(f"word{n}" for n in range(40))
REFUSED = {
    "error": {
        "type": "invalid_request_error",
        "code": "node_protocol_unsupported",
        "message": f"This node speaks node protocol versions 1 to {NODE_PROTOCOL}.",
        "param": None,
    },
}


@pytest.fixture
async def node() -> AsyncIterator[LiveServer]:
    """One keyed node whose simulator samples 5 tokens a second: a run lasts seconds."""
    keyed = ServerConfig(api_keys=frozenset({KEY}))
    live = await start_server(EngineConfig(tokens_per_second=5), server=keyed)
    try:
        yield live
    finally:
        await live.runner.cleanup()


def test_versions_spoken_answered_and_read() -> None:
    """LIVE-10: no header is version 1; this release answers 1 and 2 in their own version, a
    newer asker in its own, and refuses older ones and non-numbers; it reads 1 and 2."""
    assert NODE_PROTOCOL == 2 and list(NODE_PROTOCOL_ACCEPTED) == [1, 2]
    assert [spoken(h) for h in (None, "1", "2", "17", "x", "-1", "", "1.0")] == [
        1, 1, 2, 17, None, None, None, None,
    ]  # fmt: skip
    assert [answering(h) for h in (None, "1", "2", "3", "0", "x")] == [1, 1, 2, 2, None, None]
    assert [readable(h) for h in (None, "1", "2", "3", "0", "x")] == [1, 1, 2, None, None, None]


async def _parked(live: LiveServer, n: int) -> list[str]:
    """``n`` WebSocket creates that end on a tool call, each socket closed: parked here."""
    ids = []
    async with AsyncOpenAI(base_url=live.base_url, api_key=KEY, max_retries=0) as sdk:
        for _ in range(n):
            async with sdk.responses.connect() as conn:
                await conn.response.create(
                    model="sim", input="Weather?", tools=[WEATHER], store=False
                )
                async for event in conn:
                    if event.type == "response.completed":
                        ids.append(event.response.id)
                        break
    await wait_for(lambda: len(live.engine.parking) == n, "the rollouts parked")
    return ids


async def _ask(
    live: LiveServer, path: str, body: dict[str, Any], purpose: str, version: str | None
) -> tuple[int, str | None, str, bytes]:
    """``path`` asked with a valid node token, in ``version`` (None: no header)."""
    message = token_message(body["response_id"], body["owner"], purpose)
    headers = {TOKEN_HEADER: await live.engine.store.cluster.node_token(message)}
    if version is not None:
        headers[VERSION_HEADER] = version
    url = f"http://127.0.0.1:{live.port}{path}"
    async with aiohttp.ClientSession() as http, http.post(url, json=body, headers=headers) as r:
        return r.status, r.headers.get(VERSION_HEADER), r.content_type, await r.read()


def _shape(items: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    return [(item["type"], item.get("role") or item.get("name")) for item in items]


async def test_each_version_is_answered_in_its_own_format(node: LiveServer) -> None:
    """LIVE-10, PARK-21: the hand-over asked with no header (a node of the release before
    versions) is answered as that release did, JSON ``{"items", "tokens"}`` byte for byte
    (the items as records hold them), saying version 1; asked in 2, MessagePack, saying 2;
    asked in 3 (a newer node), this node's own version 2."""
    owner = await node.engine.store.owner_of(KEY)
    ids = await _parked(node, 4)
    answers = {}
    for response_id, version in zip(ids, (None, "1", "2", "3"), strict=True):
        asked = {"response_id": response_id, "owner": owner}
        answers[version] = await _ask(node, HANDOVER_PATH, asked, "handover", version)
    assert len(node.engine.parking) == 0  # each handed over
    for version in (None, "1"):
        status, said, kind, body = answers[version]
        assert (status, said, kind) == (200, "1", "application/json")
        v1 = json.loads(body)
        assert list(v1) == ["items", "tokens"] and v1["tokens"] is None
        assert body.startswith(b'{"items":[{') and body.endswith(b'}],"tokens":null}')
        # the items' bytes as the record codec writes them, unchanged
        assert encode_items(decode_items(body[9:-15])) == body[9:-15]
    for version in ("2", "3"):
        status, said, kind, body = answers[version]
        assert (status, said, kind) == (200, "2", MSGPACK)
        packed = msgspec.msgpack.decode(body, type=PackedAnswer)
        assert packed.tokens is None
        assert _shape(json.loads(packed.items)) == _shape(v1["items"])  # the same context


async def test_an_asker_too_old_is_refused_with_nothing_done(node: LiveServer) -> None:
    """LIVE-10: version 0, a version that is no number: 409 ``node_protocol_unsupported`` in
    the error envelope, saying this node's version, with a valid token; the parked rollout
    stays parked and the run runs on; counted ``node.protocol_refused``."""
    owner = await node.engine.store.owner_of(KEY)
    (parked,) = await _parked(node, 1)
    async with AsyncOpenAI(base_url=node.base_url, api_key=KEY, max_retries=0) as sdk:
        run = await sdk.responses.create(model="sim", input=LONG, background=True)
    asks = [
        (HANDOVER_PATH, {"response_id": parked, "owner": owner}, "handover"),
        (CANCEL_PATH, {"response_id": run.id, "owner": owner}, "run"),
    ]
    for path, body, purpose in asks:
        for version in ("0", "two"):
            status, said, _, answer = await _ask(node, path, body, purpose, version)
            assert (status, said, json.loads(answer)) == (409, str(NODE_PROTOCOL), REFUSED)
    assert node.engine.counters["node.protocol_refused"] == 4
    assert len(node.engine.parking) == 1
    assert node.engine.counters["runs.remote_cancelled"] == 0
    status, said, _, answer = await _ask(node, CANCEL_PATH, asks[1][1], "run", "1")
    assert (status, said, json.loads(answer)["status"]) == (200, "1", "cancelled")
