"""``GET /v1/responses/tokens/export`` (EXPORT-1..3): the stored token trajectories a key owns,
a page at a time, for ``rollout export``. Each id the store lists by owner is read back through
the same owner-checked chain read as ``GET /v1/responses/{id}/tokens`` (``load_stored``), so a
row is exactly what that route serves for the id."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from engine.connection.loader import load_stored
from engine.conversation.trajectory import Trajectory
from engine.server.transport import identity
from engine.server.transport.keys import ENGINE
from engine.store import Hydrated, StoreError
from engine.store.failures import wire_error
from engine.store.framing import ANY_OWNER, OwnerFilter
from protocol.codec import encode
from protocol.errors import InvalidRequest, NotFound, ServerError

DEFAULT_PAGE = 20
MAX_PAGE = 100  # records listed per page (§13): each is one chain read
MAX_CURSOR = 256  # characters: a response id, or a Redis SCAN cursor


def tokens_body(response_id: str, hydrated: Hydrated) -> dict[str, Any]:
    """The ``response.tokens`` object (TOK-8, TOK-43, EXPORT-4) of a chain with a trajectory."""
    assert hydrated.tokens
    trajectory = Trajectory.from_segments(hydrated.tokens)
    sampled = trajectory.mask()
    scores = iter(trajectory.logprobs)
    logprobs = [next(scores, None) if was_sampled else None for was_sampled in sampled]
    record = hydrated.record
    return {
        "object": "response.tokens",
        "id": response_id,
        "previous_response_id": record.parent_id,
        "model": record.response.model,
        "weights": hydrated.tokens[-1].weights or None,  # the route's tag when last sampled
        "prompt_tokens": trajectory.prompt,
        "token_ids": trajectory.all_ids(),
        "sampled": sampled,
        "logprobs": logprobs,
        # Turn boundaries: each sampled run and why it ended (TOK-43).
        "samples": [
            {"start": start, "end": end, "finish_reason": finish}
            for start, end, finish in trajectory.samples()
        ],
    }


async def export_tokens(request: web.Request) -> web.Response:
    """EXPORT-1: one page of trajectories: the caller's own, or everyone's for an operator key
    (AUTH-4). Ids without a trajectory (other routes), gone meanwhile, or unreadable (corrupt,
    STORE-9) are skipped, never an error: an export of many chains is not stopped by one."""
    engine = request.app[ENGINE]
    limit = _page_size(request.query.get("limit"))
    cursor = request.query.get("after", "")
    if len(cursor) > MAX_CURSOR:
        raise InvalidRequest("invalid_value", "after is not a cursor this server gave.", "after")
    owner: OwnerFilter = ANY_OWNER if identity.is_admin(request) else await identity.owner(request)
    try:
        ids, after = await engine.store.owned_ids(owner, cursor, limit)
    except StoreError as exc:
        raise wire_error(exc) from None
    except ValueError:  # a Redis cursor that is not a number
        message = "after is not a cursor this server gave."
        raise InvalidRequest("invalid_value", message, "after") from None
    rows = []
    for response_id in ids:
        try:
            hydrated = await load_stored(engine, response_id, owner=owner)
        except NotFound:
            continue  # expired or deleted since it was listed
        except ServerError as exc:
            if exc.code != "store_record_corrupt":
                raise
            continue
        if hydrated.tokens:
            rows.append(tokens_body(response_id, hydrated))
    body = encode({"object": "list", "data": rows, "next": after})
    return web.Response(body=body, content_type="application/json")


def _page_size(raw: str | None) -> int:
    try:
        value = DEFAULT_PAGE if raw is None else int(raw)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_PAGE:
        message = f"limit must be an integer from 1 to {MAX_PAGE}."
        raise InvalidRequest("invalid_value", message, "limit")
    return value
