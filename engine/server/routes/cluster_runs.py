"""Background runs reached from any node (SPEC: LIVE-1..LIVE-3).

A background run lives on the node that started it; the balancer sends its cancel, its DELETE
and its stream-follow to any node. The node that holds the run's lease (LIVE-1, its address in
the shared store) is asked directly, node to node, like the hand-over (PARK-21, PARK-22): never
through the balancer, which refuses ``/cluster/`` (CLUSTER-12). This module is both sides: the
routes the running node answers and the calls the asking node makes.

Why node to node and not the store: a follower reads the run's log where it is written, so an
event costs no store write and reaches every follower at the running node's latency; a cancel
is one request. When the running node is gone, so is the run: its lease lapses (or its address
answers that it runs nothing of the kind) and the reader settles the response ``failed``.
"""

from __future__ import annotations

import hmac
import logging

import aiohttp
import msgspec
from aiohttp import web

from engine.connection.background import EventsExpired
from engine.retained.handover import (
    HANDOVER_TIMEOUT_S,
    NODE_PROTOCOL,
    TOKEN_HEADER,
    VERSION_HEADER,
    readable,
    token_message,
)
from engine.server.routes.cluster import node_version
from engine.server.transport.bodies import read_body
from engine.server.transport.keys import BACKGROUND, ENGINE
from engine.store import StoreError
from engine.store.failures import wire_error
from protocol.codec import encode
from protocol.errors import HttpStatusError, InvalidRequest, Unavailable

log = logging.getLogger("rollout.cluster")

CANCEL_PATH = "/cluster/v1/runs/cancel"
EVENTS_PATH = "/cluster/v1/runs/events"
IDEM_FOLLOW_PATH = "/cluster/v1/idempotent/follow"  # a repeat follows the first (LIVE-8)
NODE_PATHS = (
    CANCEL_PATH,
    EVENTS_PATH,
    IDEM_FOLLOW_PATH,
)  # opened by the node token, not an API key
JSON = "application/json"
RELAYED_HEADERS = ("idempotent-replayed", "x-should-retry")
# A cancel waits for the run's cancelled record to be stored there (BG-6): bounded, a hung
# node is ``node_unavailable`` (LIVE-2).
CANCEL_TIMEOUT = aiohttp.ClientTimeout(total=2 * HANDOVER_TIMEOUT_S)
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


class RunRequest(msgspec.Struct, forbid_unknown_fields=True):
    """Which run, for which owner (``any_owner``: an operator's DELETE, OWN-5), and for a
    follower where to start (BG-4)."""

    response_id: str  # for ``kind`` "idem": the Idempotency-Key's scope (LIVE-8)
    owner: str | None = None
    any_owner: bool = False
    starting_after: int = -1
    kind: str = "run"


_DECODER = msgspec.json.Decoder(RunRequest)


def _purpose(asked: RunRequest) -> str:
    return f"{asked.kind}-any" if asked.any_owner else asked.kind


async def verified(request: web.Request) -> RunRequest:
    """The request's body, from a node of this cluster (PARK-22's token, LIVE-2) speaking a
    node protocol version this node answers (LIVE-10: every version so far answers these
    routes alike)."""
    engine = request.app[ENGINE]
    node_version(request)
    try:
        asked = _DECODER.decode(await read_body(request))
    except msgspec.MsgspecError:
        raise InvalidRequest("invalid_request", "Not a run request.", None) from None
    message = token_message(asked.response_id, asked.owner, _purpose(asked))
    try:
        expected = await engine.store.cluster.node_token(message)
    except StoreError as exc:
        raise wire_error(exc) from None
    if not hmac.compare_digest(expected, request.headers.get(TOKEN_HEADER, "")):
        engine.counters["runs.remote_refused"] += 1
        raise HttpStatusError(403, "forbidden", "Not a node of this cluster.")
    return asked


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


# ---------------------------------------------------------------------------- the asking side
class Elsewhere:
    """Where a run of another node is reached from this one: None from every call when no
    other node holds its lease (the caller answers as before)."""

    def __init__(self) -> None:
        self._http: aiohttp.ClientSession | None = None

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None:
            # Connect and first byte bounded; a followed stream may last as long as its run.
            timeout = aiohttp.ClientTimeout(total=None, connect=HANDOVER_TIMEOUT_S, sock_read=None)
            self._http = aiohttp.ClientSession(timeout=timeout)
        return self._http

    async def close(self, _app: web.Application | None = None) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def _where(self, request: web.Request, response_id: str) -> str | None:
        handover = request.app[ENGINE].handover
        try:
            where = await handover.running_at(response_id)
        except StoreError as exc:
            raise wire_error(exc) from None
        return None if where is None or where == handover.address else where

    async def _body(self, request: web.Request, asked: RunRequest) -> tuple[bytes, dict[str, str]]:
        message = token_message(asked.response_id, asked.owner, _purpose(asked))
        try:
            token = await request.app[ENGINE].store.cluster.node_token(message)
        except StoreError as exc:
            raise wire_error(exc) from None
        headers = {
            TOKEN_HEADER: token,
            VERSION_HEADER: str(NODE_PROTOCOL),
            "Content-Type": "application/json",
        }
        return msgspec.json.encode(asked), headers

    async def cancel(self, request: web.Request, asked: RunRequest) -> web.Response | None:
        """Cancel the run on the node holding its lease (LIVE-2): its answer (200 with the
        Response), or None when no other node holds it or that node runs nothing of the kind
        (LIVE-3: the caller settles the record). Unreachable: 503, retried by the SDK."""
        where = await self._where(request, asked.response_id)
        if where is None:
            return None
        body, headers = await self._body(request, asked)
        try:
            post = self._session().post(
                where + CANCEL_PATH, data=body, headers=headers, timeout=CANCEL_TIMEOUT
            )
            async with post as got:
                answer, status = await got.read(), got.status
                _check_version(request, where, got)
        except (aiohttp.ClientConnectorError, ConnectionRefusedError):
            return None  # nobody listens there any more: the run died with its node (LIVE-3)
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning(
                "cancel of %s at %s failed: %s", asked.response_id, where, type(exc).__name__
            )
            raise _unreachable() from None
        if status == 404:
            return None
        request.app[ENGINE].counters["runs.cancel_forwarded"] += 1
        return web.Response(body=answer, status=status, content_type="application/json")

    async def follow(self, request: web.Request, asked: RunRequest) -> web.StreamResponse | None:
        """Relay the run's SSE stream from the node holding it (LIVE-2), byte for byte; its
        error answer (a ``starting_after`` out of the window) as it is; None when no other
        node holds it or keeps its log."""
        where = await self._where(request, asked.response_id)
        if where is None:
            return None
        relayed = await self.relay(request, where, EVENTS_PATH, asked)
        if relayed is not None:
            request.app[ENGINE].counters["runs.follow_forwarded"] += 1
        return relayed

    async def relay(
        self, request: web.Request, where: str, path: str, asked: RunRequest
    ) -> web.StreamResponse | None:
        """Ask node ``where`` at ``path`` and relay its answer: an SSE stream byte for byte,
        anything else as it is; None for its 404, for this node's own address, or when
        nothing listens there (its process is gone)."""
        if where == request.app[ENGINE].handover.address:
            return None
        body, headers = await self._body(request, asked)
        try:
            async with self._session().post(where + path, data=body, headers=headers) as got:
                _check_version(request, where, got)
                if got.status == 404:
                    return None
                kept = {k: v for k, v in got.headers.items() if k.lower() in RELAYED_HEADERS}
                if got.content_type != "text/event-stream":
                    answer, status, kind = await got.read(), got.status, got.content_type
                    return web.Response(body=answer, status=status, content_type=kind, headers=kept)
                stream = web.StreamResponse(status=got.status, headers={**SSE_HEADERS, **kept})
                await stream.prepare(request)
                try:
                    async for chunk in got.content.iter_any():
                        await stream.write(chunk)
                except (aiohttp.ClientError, ConnectionError, TimeoutError):
                    return stream  # either side left: the reader resumes with starting_after
                await stream.write_eof()
                return stream
        except (aiohttp.ClientConnectorError, ConnectionRefusedError):
            return None
        except (aiohttp.ClientError, TimeoutError):
            raise _unreachable() from None


def _check_version(request: web.Request, where: str, got: aiohttp.ClientResponse) -> None:
    """A peer whose answer is in a node protocol version this node does not read (its
    refusal of this node's included) is answered as a node that does not answer (LIVE-10):
    503 ``node_unavailable``, retried; nothing of its answer is relayed."""
    version = got.headers.get(VERSION_HEADER)
    if readable(version) is None:
        request.app[ENGINE].counters["node.protocol_unsupported"] += 1
        log.warning("%s speaks node protocol %s", where, version)
        raise _unreachable()


def _unreachable() -> Unavailable:
    return Unavailable(
        "node_unavailable",
        "The server running this background response did not answer; try again.",
        None,
    )


ELSEWHERE = web.AppKey("elsewhere", Elsewhere)


def install(app: web.Application) -> None:
    app.router.add_post(CANCEL_PATH, answer_cancel)
    app.router.add_post(EVENTS_PATH, answer_events)
    app[ELSEWHERE] = elsewhere = Elsewhere()
    app.on_cleanup.append(elsewhere.close)
