"""Node to node, one room (SPEC: PARK-21, PARK-22, LIVE-2, LIVE-8, LIVE-10): the routes' paths,
the version every request and answer says, the one verifier of the node token and the one client
a node asks its peers with. The routes that answer are ``engine/server/routes/cluster.py``'s; the
hand-over's asking side is ``engine/retained/handover.py``'s, the run leases
``engine/retained/leases.py``'s.

Not client routes: no API key opens them (the balancer configs refuse ``/cluster/`` from
outside, CLUSTER-12). What opens one is a token only a process sharing this node's store can
make (PARK-22), bound to the one rollout, run or repeat and owner it names; the answering node's
own owner check then holds exactly as for that owner's request (OWN-2).

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

from engine.retained.handover import (
    HANDOVER_PATH as HANDOVER_PATH,
)
from engine.retained.handover import (
    HANDOVER_TIMEOUT_S,
    NODE_PROTOCOL,
    NODE_PROTOCOL_ACCEPTED,
    TOKEN_HEADER,
    VERSION_HEADER,
    answering,
    readable,
    token_message,
)
from engine.server.transport.bodies import read_body
from engine.server.transport.keys import ENGINE
from engine.store import StoreError
from engine.store.failures import wire_error
from protocol.errors import HttpStatusError, InvalidRequest, Unavailable

log = logging.getLogger("rollout.cluster")

CANCEL_PATH = "/cluster/v1/runs/cancel"
EVENTS_PATH = "/cluster/v1/runs/events"
IDEM_FOLLOW_PATH = "/cluster/v1/idempotent/follow"  # a repeat follows the first (LIVE-8)
# Every node route: opened by the node token, not an API key.
NODE_PATHS = (HANDOVER_PATH, CANCEL_PATH, EVENTS_PATH, IDEM_FOLLOW_PATH)
RELAYED_HEADERS = ("idempotent-replayed", "x-should-retry")
# One hand-over request, connect included (PARK-21).
HANDOVER_TIMEOUT = aiohttp.ClientTimeout(total=HANDOVER_TIMEOUT_S)
# A cancel waits for the run's cancelled record to be stored there (BG-6): bounded, a hung
# node is ``node_unavailable`` (LIVE-2).
CANCEL_TIMEOUT = aiohttp.ClientTimeout(total=2 * HANDOVER_TIMEOUT_S)
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
# The node protocol version a node route's request is answered in (LIVE-10).
NODE_VERSION = web.RequestKey("node_version", int)


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


def say_version(request: web.Request, response: web.StreamResponse) -> None:
    """Every answer of a node route says its version (LIVE-10): the one it was answered in;
    a refusal, this node's own. From the app's one ``on_response_prepare`` hook."""
    if request.path.startswith("/cluster/"):
        response.headers[VERSION_HEADER] = str(request.get(NODE_VERSION, NODE_PROTOCOL))


async def verify(request: web.Request, message: str, refused: str) -> None:
    """The one check of the node token (PARK-22): ``message`` is what the asking node signed
    (``token_message``), ``refused`` the counter a refusal counts; 403 ``forbidden`` for a
    token this store's processes did not make for it, before anything is done."""
    engine = request.app[ENGINE]
    try:
        expected = await engine.store.cluster.node_token(message)
    except StoreError as exc:
        raise wire_error(exc) from None
    if not hmac.compare_digest(expected, request.headers.get(TOKEN_HEADER, "")):
        engine.counters[refused] += 1
        raise HttpStatusError(403, "forbidden", "Not a node of this cluster.")


async def verified(request: web.Request) -> RunRequest:
    """A run or repeat route's request, from a node of this cluster (PARK-22's token, LIVE-2)
    speaking a node protocol version this node answers (LIVE-10: every version so far answers
    these routes alike)."""
    node_version(request)
    try:
        asked = _DECODER.decode(await read_body(request))
    except msgspec.MsgspecError:
        raise InvalidRequest("invalid_request", "Not a run request.", None) from None
    message = token_message(asked.response_id, asked.owner, _purpose(asked))
    await verify(request, message, "runs.remote_refused")
    return asked


# ---------------------------------------------------------------------------- the asking side
class NodeClient:
    """The one client a node asks its peers with (PARK-21, LIVE-2, LIVE-8): one aiohttp session,
    made on first use and closed with the app. ``post`` is the hand-over's (``Handover.post``:
    bounded as a whole, a node that cannot be reached an ``OSError`` to the caller); ``cancel``,
    ``follow`` and ``relay`` reach a background run or a repeat's first request on the node
    that holds it (None when no other node does: the caller answers as before)."""

    def __init__(self) -> None:
        self._http: aiohttp.ClientSession | None = None

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None:
            # Connect and first byte bounded; a followed stream may last as long as its run.
            timeout = aiohttp.ClientTimeout(total=None, connect=HANDOVER_TIMEOUT_S, sock_read=None)
            self._http = aiohttp.ClientSession(timeout=timeout)
        return self._http

    async def post(
        self, url: str, body: bytes, headers: dict[str, str]
    ) -> tuple[int, str | None, bytes]:
        """POST to a peer, bounded as a whole (PARK-21): (status, its version header, body)."""
        try:
            post = self._session().post(url, data=body, headers=headers, timeout=HANDOVER_TIMEOUT)
            async with post as resp:
                return resp.status, resp.headers.get(VERSION_HEADER), await resp.read()
        except aiohttp.ClientError as exc:
            raise ConnectionError(type(exc).__name__) from None

    async def close(self, _app: web.Application | None = None) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def _where(self, request: web.Request, response_id: str) -> str | None:
        engine = request.app[ENGINE]
        try:
            where = await engine.leases.running_at(response_id)
        except StoreError as exc:
            raise wire_error(exc) from None
        return None if where is None or where == engine.handover.address else where

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


NODES = web.AppKey("nodes", NodeClient)


def install(app: web.Application) -> None:
    """The client (the hand-over's poster too); ``say_version`` is the app's to call."""
    app[NODES] = client = NodeClient()
    app[ENGINE].handover.post = client.post
    app.on_cleanup.append(client.close)
