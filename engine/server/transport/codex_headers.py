"""Response headers Codex reads on ``/v1/responses`` answers (SPEC: CODEX-21, CODEX-22).

Codex's Responses clients read these from the WebSocket 101 (``connect_websocket`` in
codex-rs/codex-api/src/endpoint/responses_websocket.rs) and from HTTP answers
(``ResponsesStreamMetadata::from_headers``, codex-rs/codex-api/src/endpoint/responses.rs):

* ``x-reasoning-included``: present means "input_tokens already count the reasoning items you
  sent back", so Codex stops estimating them itself (``ServerReasoningIncluded``). True here:
  a replayed ``reasoning`` item is rendered and counted like any input (ITEM-5).
* ``openai-model``: the model that served the request. Codex compares it with the model it asked
  for and warns the user of a reroute when they differ. An HTTP create knows its model, so it is
  named; the 101 precedes every create, so it carries none (a guess would read as a reroute).
* ``x-models-etag`` is deliberately not sent: a new etag makes Codex refetch its model catalog
  from ``GET /models`` in its own schema, which this server does not serve (CODEX-22).

The app's one ``on_response_prepare`` hook stamps them, like the turn-state token (TURN-2), so no
route can forget them; refusals (status 400 and above) carry none.
"""

from __future__ import annotations

from aiohttp import web

REASONING_INCLUDED = "x-reasoning-included"
OPENAI_MODEL = "openai-model"
SERVED_MODEL = web.RequestKey("served_model", str)  # set by the HTTP create once decoded
ROUTED_PATH = "/v1/responses"


def note_model(request: web.Request, model: str) -> None:
    """The model an HTTP create asked for: it is what answers it (the router never substitutes
    one model for another), so it is the ``openai-model`` of its answer."""
    request[SERVED_MODEL] = model


def stamp(request: web.Request, response: web.StreamResponse) -> None:
    """From the app's one ``on_response_prepare`` hook."""
    if request.path != ROUTED_PATH or response.status >= 400:
        return
    response.headers[REASONING_INCLUDED] = "true"
    model = request.get(SERVED_MODEL)
    if model:
        response.headers[OPENAI_MODEL] = model


def is_codex(request: web.Request) -> bool:
    """The request comes from Codex (its `originator` header: `codex_exec`, `codex_cli_rs`, …):
    the only client that reads Codex-only events such as `codex.rate_limits` (CODEX-26)."""
    return request.headers.get("originator", "").startswith("codex")
