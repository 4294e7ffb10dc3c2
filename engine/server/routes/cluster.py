"""The node-to-node route: hand a parked rollout over to the node its client reconnected to
(SPEC: PARK-21, PARK-22). The asking side is ``engine/retained/handover.py``.

Not a client route: no API key opens it (the balancer configs refuse ``/cluster/`` from
outside, CLUSTER-12). What opens it is a token only a process sharing this node's store can
make (PARK-22), bound to the one rollout and owner it names; the lot's own owner check then
holds exactly as for a reconnect of that owner (OWN-2).
"""

from __future__ import annotations

import hmac

import aiohttp
import msgspec
from aiohttp import web

from engine.retained.handover import (
    HANDOVER_PATH,
    HANDOVER_TIMEOUT_S,
    NODE_PROTOCOL,
    NODE_PROTOCOL_ACCEPTED,
    TOKEN_HEADER,
    VERSION_HEADER,
    HandoverRequest,
    answering,
    encode_answer,
    token_message,
)
from engine.rollout.coroutine import Rollout
from engine.server.transport.bodies import read_body
from engine.server.transport.keys import ENGINE
from engine.store import StoreError
from engine.store.failures import wire_error
from engine.store.record_codec import encode_items
from protocol.errors import HttpStatusError, InvalidRequest

_DECODER = msgspec.json.Decoder(HandoverRequest)
# The node protocol version a node route's request is answered in (LIVE-10).
NODE_VERSION = web.RequestKey("node_version", int)


def node_version(request: web.Request) -> int:
    """The version to answer this node route's request in (LIVE-10): the asker's, or this
    node's own for a newer asker; an asker older than this node still answers is refused,
    409 ``node_protocol_unsupported``, before its token is read or anything is done."""
    version = answering(request.headers.get(VERSION_HEADER))
    if version is None:
        request.app[ENGINE].counters["node.protocol_refused"] += 1
        first, last = NODE_PROTOCOL_ACCEPTED[0], NODE_PROTOCOL_ACCEPTED[-1]
        raise HttpStatusError(
            409,
            "node_protocol_unsupported",
            f"This node speaks node protocol versions {first} to {last}.",
        )
    request[NODE_VERSION] = version
    return version


async def say_version(request: web.Request, response: web.StreamResponse) -> None:
    """Every answer of a node route says its version (LIVE-10): the one it was answered in;
    a refusal, this node's own."""
    if request.path.startswith("/cluster/"):
        response.headers[VERSION_HEADER] = str(request.get(NODE_VERSION, NODE_PROTOCOL))


async def handover(request: web.Request) -> web.Response:
    """Claim the rollout parked behind the named response for the named owner, retire it here
    and answer its context's items and token trajectory (200, LIVE-4) in the asker's node
    protocol version (LIVE-10: JSON in 1, MessagePack in 2); 404 when nothing
    is parked under that id for that owner; 403 for a token this store's processes did not make."""
    engine = request.app[ENGINE]
    version = node_version(request)
    try:
        asked = _DECODER.decode(await read_body(request))
    except msgspec.MsgspecError:
        raise InvalidRequest("invalid_request", "Not a hand-over request.", None) from None
    try:
        expected = await engine.store.cluster.node_token(
            token_message(asked.response_id, asked.owner)
        )
    except StoreError as exc:
        raise wire_error(exc) from None
    if not hmac.compare_digest(expected, request.headers.get(TOKEN_HEADER, "")):
        engine.counters["park.handover_refused"] += 1
        raise HttpStatusError(403, "forbidden", "Not a node of this cluster.")
    entry = engine.parking.claim(asked.response_id, asked.owner)
    if entry is None:
        raise HttpStatusError(404, "not_found", "Nothing parked under that id.")
    assert isinstance(entry.rollout, Rollout)  # the only kind a session parks
    ctx = entry.rollout.ctx
    trajectory = ctx.model_tokens  # carried as it was sampled (LIVE-4)
    tokens = None
    if trajectory is not None and trajectory.covered == len(ctx.items):
        tokens = trajectory.segment(snapshot=True)
    body, kind = encode_answer(encode_items(list(ctx.items)), tokens, version)  # the asker's
    engine.parking.release(entry)  # it lives on over there: retire this copy (never two)
    engine.counters["park.handed_over"] += 1
    return web.Response(body=body, content_type=kind)


class NodeClient:
    """The asking side's HTTP client (PARK-21): one session, made on first use, closed with
    the app; a node that cannot be reached is an ``OSError`` to the caller."""

    def __init__(self) -> None:
        self._http: aiohttp.ClientSession | None = None

    async def post(
        self, url: str, body: bytes, headers: dict[str, str]
    ) -> tuple[int, str | None, bytes]:
        if self._http is None:
            timeout = aiohttp.ClientTimeout(total=HANDOVER_TIMEOUT_S)
            self._http = aiohttp.ClientSession(timeout=timeout)
        try:
            async with self._http.post(url, data=body, headers=headers) as resp:
                return resp.status, resp.headers.get(VERSION_HEADER), await resp.read()
        except aiohttp.ClientError as exc:
            raise ConnectionError(type(exc).__name__) from None

    async def close(self, _app: web.Application | None = None) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None


def install(app: web.Application) -> None:
    app.router.add_post(HANDOVER_PATH, handover)
    app.on_response_prepare.append(say_version)
    client = NodeClient()
    app[ENGINE].handover.post = client.post
    app.on_cleanup.append(client.close)
