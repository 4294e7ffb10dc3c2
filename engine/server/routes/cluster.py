"""The node routes, the answering side (SPEC: PARK-21, LIVE-2, LIVE-8): hand a parked rollout
over to the node its client reconnected to, cancel or stream a background run of this node for
another node's client, and let another node's repeat follow the first request of its
Idempotency-Key here. Each is opened by the node token (``engine/server/transport/node.py``'s
``verify``), never by an API key.
"""

from __future__ import annotations

import msgspec
from aiohttp import web

from engine.connection.background import EventsExpired
from engine.retained.handover import HandoverRequest, encode_answer, token_message
from engine.rollout.coroutine import Rollout
from engine.server.transport import idempotency
from engine.server.transport.bodies import read_body
from engine.server.transport.keys import BACKGROUND, ENGINE
from engine.server.transport.node import (
    CANCEL_PATH,
    EVENTS_PATH,
    HANDOVER_PATH,
    IDEM_FOLLOW_PATH,
    SSE_HEADERS,
    node_version,
    verified,
    verify,
)
from engine.store.record_codec import encode_items
from protocol.codec import encode
from protocol.errors import HttpStatusError, InvalidRequest

_HANDOVER = msgspec.json.Decoder(HandoverRequest)


async def handover(request: web.Request) -> web.Response:
    """Claim the rollout parked behind the named response for the named owner, retire it here
    and answer its context's items and token trajectory (200, LIVE-4) in the asker's node
    protocol version (LIVE-10: JSON in 1, MessagePack in 2); 404 when nothing
    is parked under that id for that owner; 403 for a token this store's processes did not make."""
    engine = request.app[ENGINE]
    version = node_version(request)
    try:
        asked = _HANDOVER.decode(await read_body(request))
    except msgspec.MsgspecError:
        raise InvalidRequest("invalid_request", "Not a hand-over request.", None) from None
    await verify(request, token_message(asked.response_id, asked.owner), "park.handover_refused")
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


def _not_here(response_id: str) -> HttpStatusError:
    return HttpStatusError(404, "not_found", f"No background run '{response_id}' here.")


async def answer_cancel(request: web.Request) -> web.Response:
    """Cancel a run of this node for its owner (BG-6): 200 with the cancelled Response; 404
    when this node runs nothing under that id for that owner (finished, or never here)."""
    asked = await verified(request)
    run = request.app[BACKGROUND].find(asked.response_id)
    if asked.kind != "run" or run is None or not (asked.any_owner or run.owner == asked.owner):
        raise _not_here(asked.response_id)
    await run.cancel()
    request.app[ENGINE].counters["runs.remote_cancelled"] += 1
    return web.Response(body=encode(run.snapshot()), content_type="application/json")


async def answer_events(request: web.Request) -> web.StreamResponse:
    """A run's events after ``starting_after`` as SSE, then followed (BG-4, BG-5), for the
    node whose client follows it; 404 when no log of that run and owner is kept here."""
    asked = await verified(request)
    log_ = request.app[BACKGROUND].event_log(asked.response_id)
    if asked.kind != "run" or log_ is None or log_.owner != asked.owner:
        raise _not_here(asked.response_id)
    log_.check_start(asked.starting_after)
    request.app[ENGINE].counters["runs.remote_followed"] += 1
    stream = web.StreamResponse(headers=SSE_HEADERS)
    await stream.prepare(request)
    try:
        async for data in log_.follow(asked.starting_after):
            await stream.write(data)
    except (ConnectionError, EventsExpired):
        return stream
    await stream.write_eof()
    return stream


async def answer_follow(request: web.Request) -> web.StreamResponse:
    """``POST /cluster/v1/idempotent/follow`` (LIVE-8): another node's repeat of a request this
    node runs follows it here: its stream live, or its answer once answered; 404 when it is
    not running here (answered meanwhile: the repeat reads the settled entry)."""
    asked = await verified(request)
    answer = (
        await idempotency.follow_here(request, asked.response_id) if asked.kind == "idem" else None
    )
    if answer is None:
        raise HttpStatusError(404, "not_found", "Not running here.")
    return answer


def install(app: web.Application) -> None:
    app.router.add_post(HANDOVER_PATH, handover)
    app.router.add_post(CANCEL_PATH, answer_cancel)
    app.router.add_post(EVENTS_PATH, answer_events)
    app.router.add_post(IDEM_FOLLOW_PATH, answer_follow)
