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
    TOKEN_HEADER,
    HandoverAnswer,
    HandoverRequest,
    token_message,
)
from engine.rollout.coroutine import Rollout
from engine.server.transport.keys import ENGINE
from engine.store import StoreError
from engine.store.failures import wire_error
from engine.store.record_codec import encode_items
from protocol.errors import HttpStatusError, InvalidRequest

_DECODER = msgspec.json.Decoder(HandoverRequest)


async def handover(request: web.Request) -> web.Response:
    """Claim the rollout parked behind the named response for the named owner, retire it here
    and answer its context's items and token trajectory (200 JSON, LIVE-4); 404 when nothing
    is parked under that id for that owner; 403 for a token this store's processes did not make."""
    engine = request.app[ENGINE]
    try:
        asked = _DECODER.decode(await request.read())
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
    answer = HandoverAnswer(msgspec.Raw(encode_items(list(ctx.items))), tokens)
    engine.parking.release(entry)  # it lives on over there: retire this copy (never two)
    engine.counters["park.handed_over"] += 1
    return web.Response(body=msgspec.json.encode(answer), content_type="application/json")


class NodeClient:
    """The asking side's HTTP client (PARK-21): one session, made on first use, closed with
    the app; a node that cannot be reached is an ``OSError`` to the caller."""

    def __init__(self) -> None:
        self._http: aiohttp.ClientSession | None = None

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        if self._http is None:
            timeout = aiohttp.ClientTimeout(total=HANDOVER_TIMEOUT_S)
            self._http = aiohttp.ClientSession(timeout=timeout)
        try:
            async with self._http.post(url, data=body, headers=headers) as resp:
                return resp.status, await resp.read()
        except aiohttp.ClientError as exc:
            raise ConnectionError(type(exc).__name__) from None

    async def close(self, _app: web.Application | None = None) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None


def install(app: web.Application) -> None:
    app.router.add_post(HANDOVER_PATH, handover)
    client = NodeClient()
    app[ENGINE].handover.post = client.post
    app.on_cleanup.append(client.close)
