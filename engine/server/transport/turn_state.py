"""The ``x-codex-turn-state`` sticky-routing token (SPEC: TURN-1..TURN-4).

Codex keeps one token per turn: it takes the value of the ``x-codex-turn-state`` response
header of the turn's first request (the WebSocket 101, or an HTTP response), and sends it back
unchanged as a request header on every later request of that turn (a reconnect, the next HTTP
POST), never across turns (codex-rs/core/src/client.rs ``ModelClientSession::turn_state``,
codex-rs/codex-api/src/endpoint/responses_websocket.rs ``connect_websocket``).

This server issues the token and names itself in it, so a load balancer can route every request
of a turn to the node that served its first one (where the turn's connection cache, suspended
coroutine or parked rollout lives) by reading one header field:

    rts1.<node id>.<32 hex>

A request that presents a well-formed token gets the same token back (Codex ignores a changed
value within a turn, and the balancer keeps routing on the one it saw); any other request gets a
new one naming this node. The token is only a routing hint: the server never refuses or changes
a request because of it, so a malformed, foreign or stale token costs nothing but a count.
"""

from __future__ import annotations

import re
import secrets
import socket
from collections.abc import Callable

from aiohttp import web

from engine.core import Engine

HEADER = "x-codex-turn-state"
VERSION = "rts1"
NODE_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
TOKEN = re.compile(rf"{VERSION}\.({NODE_ID.pattern})\.[0-9a-f]{{32}}")
ROUTED_PATH = "/v1/responses"  # the WebSocket upgrade and the HTTP create share it (WS-1)


def default_node_id() -> str:
    """This host's name reduced to the node-id alphabet: a stable default for one node per
    host. Several nodes on one host need ``--node-id`` each."""
    name = re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname())[:64].strip("-")
    return name or "node"


def check_node_id(node_id: str) -> str:
    if not NODE_ID.fullmatch(node_id):
        raise ValueError(f"node id {node_id!r} must match {NODE_ID.pattern}")
    return node_id


def new_token(node_id: str) -> str:
    return f"{VERSION}.{node_id}.{secrets.token_hex(16)}"


def node_of(token: str) -> str | None:
    """The node a well-formed token names, or None."""
    match = TOKEN.fullmatch(token)
    return match.group(1) if match else None


def answer(presented: str | None, node_id: str, engine: Engine) -> str:
    """The token to send back for a request that presented ``presented`` (TURN-2)."""
    named = node_of(presented) if presented else None
    if presented is None or named is None:
        engine.counters["turn_state.issued"] += 1
        return new_token(node_id)
    engine.counters["turn_state.echoed" if named == node_id else "turn_state.foreign"] += 1
    return presented


def stamper(engine: Engine, node_id: str) -> Callable[[web.Request, web.StreamResponse], None]:
    """Stamps the token on every answer of ``/v1/responses`` before its headers leave: the 101
    of an upgrade, an SSE stream, a JSON response. Called from the app's one
    ``on_response_prepare`` hook, so no route can forget it."""

    def stamp(request: web.Request, response: web.StreamResponse) -> None:
        if request.path == ROUTED_PATH and response.status < 400:
            response.headers[HEADER] = answer(request.headers.get(HEADER), node_id, engine)

    return stamp
