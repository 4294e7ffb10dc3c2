"""OpenTelemetry traces (OTEL-1..OTEL-6): a WebSocket rollout with a tool call, routed to a
chat upstream, exports real OTLP/HTTP to a collector the test runs (an aiohttp server decoding
the protobuf with ``opentelemetry-proto``). The tree hangs off the client's ``traceparent``; the
upstream requests carry the response span's; no content or key is an attribute. Off, no tracer
is touched."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from tests.support.server import serve_app
from tests.support.wait import wait_for
from tests.upstream.conftest import StartEngine, router_for
from tests.upstream.peer import SECRET, ChatPeer

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
SECRET_INPUT = "weather in Paris, says the private note 7f3c"
TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


class Collector:
    """``POST /v1/traces``: every span received, decoded from OTLP's protobuf."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.runner: web.AppRunner | None = None
        self.port = 0

    async def receive(self, request: web.Request) -> web.Response:
        assert request.content_type == "application/x-protobuf"
        export = ExportTraceServiceRequest.FromString(await request.read())
        for resource in export.resource_spans:
            for scope in resource.scope_spans:
                self.spans.extend(scope.spans)
        answer = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=answer, content_type="application/x-protobuf")

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/traces", self.receive)
        self.runner, self.port = await serve_app(app)


@pytest.fixture
async def collector() -> AsyncIterator[Collector]:
    found = Collector()
    await found.start()
    try:
        yield found
    finally:
        assert found.runner is not None
        await found.runner.cleanup()


def attributes(span: Span) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in span.attributes:
        value = pair.value
        kind = value.WhichOneof("value")
        out[pair.key] = getattr(value, kind) if kind else None
    return out


async def rollout_with_a_tool_call(ws_url: str) -> list[str]:
    """Two creates: the model calls the tool, then answers from its output. Returns the ids."""
    ids: list[str] = []
    headers = {"traceparent": TRACEPARENT}
    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url, headers=headers) as ws:
        create: dict[str, Any] = {"model": "model-a", "input": SECRET_INPUT, "tools": [TOOL]}
        for _ in range(2):
            await ws.send_str(json.dumps({"type": "response.create", **create}))
            while (event := json.loads(await ws.receive_str(timeout=30)))["type"] != (
                "response.completed"
            ):
                assert event["type"] != "error", event
            response = event["response"]
            ids.append(response["id"])
            calls = [item for item in response["output"] if item["type"] == "function_call"]
            output = [
                {"type": "function_call_output", "call_id": c["call_id"], "output": "sunny"}
                for c in calls
            ]
            create = {"model": "model-a", "previous_response_id": response["id"], "input": output}
    return ids


async def test_trace_tree_of_a_ws_rollout(
    collector: Collector, chat_peer: ChatPeer, engine_for: StartEngine
) -> None:
    endpoint = f"http://127.0.0.1:{collector.port}"
    live = await engine_for(router_for("chat", chat_peer.base_url), otel_endpoint=endpoint)
    ids = await rollout_with_a_tool_call(live.ws_url)

    def named(name: str) -> list[Span]:
        return [span for span in collector.spans if span.name == name]

    # Spans leave in batches, in the order they end (a response's own span may end after its
    # post-inference): wait for every kind of both responses, not the last one to end.
    kinds = ("response", "pre_inference", "model", "store", "post_inference")
    await wait_for(
        lambda: all(len(named(kind)) >= 2 for kind in kinds), "both responses' spans exported"
    )
    responses = named("response")
    assert sorted(attributes(s)["rollout.response_id"] for s in responses) == sorted(ids)
    for span in collector.spans:  # one trace, the client's (OTEL-2)
        assert span.trace_id.hex() == CLIENT_TRACE
    for response in responses:
        assert response.parent_span_id.hex() == CLIENT_SPAN
        assert response.kind == Span.SpanKind.SPAN_KIND_SERVER
        own = {s.name for s in collector.spans if s.parent_span_id == response.span_id}
        assert {"pre_inference", "model", "store", "post_inference"} <= own, own
        group = next(s for s in named("pre_inference") if s.parent_span_id == response.span_id)
        stages = attributes(group)
        assert "rollout.stage.render_ms" in stages and "rollout.stage.validate_ms" in stages
        assert attributes(response)["rollout.status"] == "completed"
    second = next(s for s in responses if attributes(s)["rollout.response_id"] == ids[1])
    assert attributes(second)["rollout.previous_response_id"] == ids[0]
    # The upstream calls continue the trace under their response's span (OTEL-4).
    sent = [r.headers["traceparent"] for r in chat_peer.requests]
    spans = {r.span_id.hex() for r in responses}
    assert len(sent) == 2 and all(tp.split("-")[1] == CLIENT_TRACE for tp in sent)
    assert {tp.split("-")[2] for tp in sent} == spans
    # No content and no key in any attribute (OTEL-5).
    values = [str(v) for span in collector.spans for v in attributes(span).values()]
    assert not any("Paris" in v or "7f3c" in v or SECRET in v or "sunny" in v for v in values)


async def test_off_touches_no_tracer(
    collector: Collector,
    chat_peer: ChatPeer,
    engine_for: StartEngine,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """OTEL-6: with tracing off no span is made: the SDK's tracer is never asked for one, and
    the upstream gets no ``traceparent``. The same spy, on an engine with tracing on, sees the
    spans of the same rollout (so an empty count means no span, not a spy that sees none)."""
    from opentelemetry.sdk.trace import Tracer

    started: list[str] = []
    original = Tracer.start_span

    def counting(self: Tracer, name: str, *args: Any, **kwargs: Any) -> Any:
        started.append(name)
        return original(self, name, *args, **kwargs)

    monkeypatch.setattr(Tracer, "start_span", counting)
    live = await engine_for(router_for("chat", chat_peer.base_url))
    assert live.engine.tracing is None
    await rollout_with_a_tool_call(live.ws_url)
    assert started == []
    assert len(chat_peer.requests) == 2
    assert all("traceparent" not in r.headers for r in chat_peer.requests)
    endpoint = f"http://127.0.0.1:{collector.port}"
    traced = await engine_for(router_for("chat", chat_peer.base_url), otel_endpoint=endpoint)
    await rollout_with_a_tool_call(traced.ws_url)
    assert started.count("response") == 2, started
    assert all("traceparent" in r.headers for r in chat_peer.requests[2:]), chat_peer.requests
