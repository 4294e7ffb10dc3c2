"""Shared fixtures: a real server on an ephemeral loopback port, and the SDK conformance oracle.

Every event the server writes during a test (WebSocket frames and SSE events) is recorded and,
at teardown, parsed with the official ``openai`` SDK's event models (CONF-1). Our experimental
extension events (``response.done``) are checked against our own schema instead. Every event and
every HTTP JSON body is also checked against the Open Responses required-field tables
(``tests/conformance/open_responses.py``, CONF-3).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import msgspec
import pydantic
import pytest
from aiohttp import web
from hypothesis import HealthCheck, settings

from engine.core import Engine, EngineConfig
from engine.models.router import Router
from engine.server import http as http_routes
from engine.server import ws as ws_driver
from engine.server.app import create_app
from engine.store import ResponseStore
from protocol.codec import encode, http_error_body
from protocol.errors import ProtocolError
from protocol.events import ServerEvent
from tests.conformance.open_responses import check_body, check_event

settings.register_profile(
    "ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "dev", max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "deep", max_examples=10_000, deadline=None, suppress_health_check=list(HealthCheck)
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

# ----------------------------------------------------------------------------- hypothesis seed

_SEED = pytest.StashKey[str]()


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Every run has one hypothesis seed, and it is visible: ``--hypothesis-seed`` if given
    (``make fuzz SEED=…`` passes it), otherwise a fresh random one, so each run still explores
    new sequences (FUZZ-6). It is shown in the header, beside every failure and in the summary
    of a failed run; ``--hypothesis-seed=<seed>`` replays the run's generation."""
    seed = config.getoption("hypothesis_seed")
    if seed is None:
        seed = str(secrets.randbits(32))
        config.option.hypothesis_seed = seed
        from hypothesis import core  # in case hypothesis' own configure hook ran first

        core.global_force_seed = int(seed)  # type: ignore[assignment]
    config.stash[_SEED] = str(seed)


def _replay_hint(config: pytest.Config) -> str:
    seed = config.stash[_SEED]
    return f"hypothesis seed: {seed} (replay: --hypothesis-seed={seed}, or make fuzz SEED={seed})"


def pytest_report_header(config: pytest.Config) -> str:
    return _replay_hint(config)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.failed:
        report.sections.append(("hypothesis seed", _replay_hint(item.config)))
    return report


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if terminalreporter.stats.get("failed") or terminalreporter.stats.get("error"):
        terminalreporter.write_sep("=", _replay_hint(config))


# ----------------------------------------------------------------------------- event recorder

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
    http_routes.json_response = json_response
    http_routes.error_response = error_response
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


def sdk_parse(raw: bytes | dict[str, Any]) -> Any:
    """Parse one server event with the openai SDK's own models (the conformance oracle)."""
    standard, beta = _adapters()
    data = msgspec.json.decode(raw) if isinstance(raw, bytes) else raw
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


@pytest.fixture(autouse=True)
def sdk_oracle() -> Iterator[list[bytes]]:
    """Teardown check: everything this test made the server emit parses with the SDK and
    satisfies the Open Responses required fields."""
    start, body_start = len(RECORDED), len(BODIES)
    yield RECORDED
    from openai.types.responses import Response

    for raw in RECORDED[start:]:
        parsed = sdk_parse(raw)
        if isinstance(parsed, dict):  # response.done: validate the snapshot it carries
            Response.model_validate(parsed["response"])
    faults = open_responses_faults(RECORDED[start:], BODIES[body_start:])
    del RECORDED[start:]
    del BODIES[body_start:]
    assert not faults, f"{len(faults)} Open Responses faults, first: {faults[:5]}"


# ----------------------------------------------------------------------------- live server


# The one function tool most tests offer: strict, one required string parameter.
WEATHER: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


@dataclass
class LiveServer:
    engine: Engine
    port: int
    runner: web.AppRunner
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/responses"


async def start_server(
    config: EngineConfig | None = None,
    router: Router | None = None,
    store: ResponseStore | None = None,
    **app_kwargs: Any,
) -> LiveServer:
    engine = Engine(config or EngineConfig(tokens_per_second=0), router=router, store=store)
    app = create_app(engine, **app_kwargs)
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server = site._server
    assert server is not None
    port = server.sockets[0].getsockname()[1]
    return LiveServer(engine=engine, port=port, runner=runner)


@pytest.fixture
async def server() -> AsyncIterator[LiveServer]:
    """A real server on an ephemeral loopback port; simulated model at full speed (no pacing)."""
    live = await start_server()
    try:
        yield live
    finally:
        await live.runner.cleanup()


@pytest.fixture
async def server_factory() -> AsyncIterator[Callable[..., Any]]:
    """Start servers with a custom ``EngineConfig``; all are cleaned up after the test."""
    started: list[LiveServer] = []

    async def make(
        config: EngineConfig | None = None, router: Router | None = None, **kwargs: Any
    ) -> LiveServer:
        live = await start_server(config, router, **kwargs)
        started.append(live)
        return live

    try:
        yield make
    finally:
        for live in started:
            await live.runner.cleanup()
