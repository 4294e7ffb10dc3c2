"""The conformance oracle: every event the server writes in a test process is recorded, and
checked with the openai SDK's models (CONF-1) and the Open Responses tables (CONF-3).

Importing this module wraps the server's sinks once (``tests/conftest.py`` does, before any
server starts); the autouse ``sdk_oracle`` fixture checks what each test made the server emit.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import msgspec
import pydantic
from aiohttp import web

from engine.server.routes import ops, v1_responses
from engine.server.transport import http as http_routes
from engine.server.transport import ws as ws_driver
from protocol.codec import encode, http_error_body
from protocol.errors import ProtocolError
from protocol.events import ServerEvent
from tests.conformance.open_responses import check_body, check_event

RECORDED: list[bytes] = []
BODIES: list[bytes] = []  # HTTP JSON bodies (Response, compaction, errors), checked by CONF-3
EXTENSION_REASONS = {"idle_timeout"}  # incomplete_details.reason values only append mode emits


def _install_recorder() -> None:
    """Wrap both sinks once so every emitted event is captured (encoded exactly as sent)."""
    if getattr(ws_driver.WsSink, "_recorded", False):
        return
    original_ws = ws_driver.WsSink.send
    original_http = http_routes.HttpSink.send

    async def ws_send(self: Any, event: ServerEvent) -> None:
        RECORDED.append(encode(event))
        await original_ws(self, event)

    async def http_send(self: Any, event: ServerEvent) -> None:
        RECORDED.append(encode(event))
        await original_http(self, event)

    original_json = http_routes.json_response

    def json_response(body: Any, status: int = 200) -> web.Response:
        BODIES.append(encode(body))
        return original_json(body, status)

    original_error = http_routes.error_response

    def error_response(err: ProtocolError) -> web.Response:
        BODIES.append(http_error_body(err))
        return original_error(err)

    ws_driver.WsSink.send = ws_send  # type: ignore[method-assign]
    http_routes.HttpSink.send = http_send  # type: ignore[method-assign]
    # where the answers are made: the transport's helpers and the routes that import them
    for module in (http_routes, v1_responses, ops):
        module.json_response = json_response
        module.error_response = error_response
    ws_driver.WsSink._recorded = True


_install_recorder()


@lru_cache(maxsize=1)
def _adapters() -> tuple[pydantic.TypeAdapter[Any], pydantic.TypeAdapter[Any]]:
    """Building these schemas takes seconds: once per test process."""
    from openai.types.beta import BetaResponsesServerEvent
    from openai.types.responses import ResponsesServerEvent

    return (
        pydantic.TypeAdapter(ResponsesServerEvent),
        pydantic.TypeAdapter(BetaResponsesServerEvent),
    )


class _CodexWindow(msgspec.Struct):
    """Codex's ``RateLimitEventWindow`` (``codex-api/src/rate_limits.rs``): serde's types."""

    used_percent: float
    window_minutes: int | None = None
    reset_at: int | None = None


class _CodexDetails(msgspec.Struct):
    primary: _CodexWindow | None = None
    secondary: _CodexWindow | None = None


class _CodexRateLimits(msgspec.Struct):
    """Codex's ``RateLimitEvent``: what its parser needs of ``codex.rate_limits`` (RATE-6)."""

    type: str
    rate_limits: _CodexDetails | None = None


def sdk_parse(raw: bytes | dict[str, Any]) -> Any:
    """Parse one server event with the openai SDK's own models (the conformance oracle).
    Codex's own events (``codex.*``) are not the SDK's: they are parsed as Codex does."""
    standard, beta = _adapters()
    data = msgspec.json.decode(raw) if isinstance(raw, bytes) else raw
    if data.get("type") == "codex.rate_limits":
        return msgspec.convert(data, _CodexRateLimits)
    if data.get("type") == "response.done":
        return data  # our extension; its embedded Response is checked by the caller
    if data.get("type", "").startswith("response.inject"):
        return beta.validate_python(data)
    details = (data.get("response") or {}).get("incomplete_details") or {}
    if details.get("reason") in EXTENSION_REASONS:
        # Append mode's documented extension value (APPEND-6): check everything else strictly.
        response = {**data["response"], "incomplete_details": {"reason": None}}
        return standard.validate_python({**data, "response": response})
    return standard.validate_python(data)


def open_responses_faults(events: list[bytes], bodies: list[bytes]) -> list[str]:
    """Every fault of these frames against the Open Responses tables (CONF-3)."""
    faults: list[str] = []
    for raw in events:
        data = msgspec.json.decode(raw)
        faults += [f"{data.get('type')} {fault}" for fault in check_event(data)]
    for raw in bodies:
        data = msgspec.json.decode(raw)
        if isinstance(data, dict):
            faults += [f"HTTP body {fault}" for fault in check_body(data)]
    return faults
