"""OpenTelemetry traces over OTLP/HTTP, off by default (SPEC: OTEL-1..OTEL-6).

One span per response (``response``, kind SERVER), a child of the client's W3C ``traceparent``
when it sent one, with children for what the turn did: ``pre_inference`` (its stages' times as
attributes), ``model`` (each sampling step: the upstream call), ``store`` and ``post_inference``.
Attributes name the rollout and the responses, never content or keys.

Off, nothing here runs: the engine holds no ``Tracing``, a turn no ``TurnTrace``, and the only
cost on the turn path is a few ``is None`` tests. The SDK is imported only when tracing is on.
The child spans are recorded when the response ends, from the turn log's marks (each stage's
end time and length, taken where the stage ends), so no span object lives during the turn but
the response's own.
"""

from __future__ import annotations

import time
from typing import Any

from engine.observe.turnlog import PRE_STAGES

PRE_GROUP = (*PRE_STAGES, "hydrate", "dispatch")  # stages before the model samples (OBS-1)
EXPORT_DELAY_MS = 500  # spans leave in batches, from the SDK's own thread, this often


def traces_url(endpoint: str) -> str:
    """``--otel-endpoint`` is the collector's base URL (``http://host:4318``), as
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` is; spans go to its ``/v1/traces``. A URL that already ends
    so is kept."""
    base = endpoint.rstrip("/")
    return base if base.endswith("/v1/traces") else f"{base}/v1/traces"


class Tracing:
    """The tracer provider and its OTLP/HTTP exporter (OTEL-1)."""

    def __init__(self, endpoint: str, service: str = "rollout-engine") -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._provider = TracerProvider(resource=Resource.create({"service.name": service}))
        exporter = OTLPSpanExporter(endpoint=traces_url(endpoint))
        processor = BatchSpanProcessor(exporter, schedule_delay_millis=EXPORT_DELAY_MS)
        self._provider.add_span_processor(processor)
        self._tracer = self._provider.get_tracer("rollout.engine")
        self._propagator = TraceContextTextMapPropagator()

    def start_turn(self, traceparent: str | None, attributes: dict[str, Any]) -> TurnTrace:
        """The response's span, started now (OTEL-2); a malformed ``traceparent`` is ignored
        (a new trace starts), as W3C Trace Context says."""
        from opentelemetry.trace import SpanKind

        parent = self._propagator.extract({"traceparent": traceparent}) if traceparent else None
        span = self._tracer.start_span(
            "response", context=parent, kind=SpanKind.SERVER, attributes=attributes
        )
        return TurnTrace(self._tracer, span)

    def shutdown(self) -> None:
        """Export what is left and stop (blocking: the engine calls it in a thread)."""
        self._provider.shutdown()


class TurnTrace:
    """One response's span and the ``traceparent`` its model calls carry (OTEL-4)."""

    __slots__ = ("_tracer", "marks", "span", "traceparent")

    def __init__(self, tracer: Any, span: Any) -> None:
        self._tracer = tracer
        self.span = span
        context = span.get_span_context()
        flags = int(context.trace_flags)
        self.traceparent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{flags:02x}"
        self.marks: list[tuple[str, int, float]] = []  # (stage, end ns, seconds), TurnLog's

    def child(
        self, name: str, start_ns: int, end_ns: int, parent: Any = None, **attributes: Any
    ) -> Any:
        from opentelemetry.trace import set_span_in_context

        context = set_span_in_context(parent if parent is not None else self.span)
        span = self._tracer.start_span(
            name, context=context, start_time=start_ns, attributes=attributes or None
        )
        span.end(end_time=end_ns)
        return span

    def finish(self, attributes: dict[str, Any]) -> None:
        """The response ended (its terminal event is out): its stages become child spans and
        its span ends (OTEL-3)."""
        pre = [mark for mark in self.marks if mark[0] in PRE_GROUP]
        if pre:  # its stages are attributes, not spans: a span costs ~0.1 ms of CPU (OTEL-6)
            start = min(end - int(seconds * 1e9) for _, end, seconds in pre)
            stages: dict[str, float] = {}
            for stage, _, seconds in pre:
                key = f"rollout.stage.{stage}_ms"
                stages[key] = stages.get(key, 0.0) + round(seconds * 1000, 3)
            self.child("pre_inference", start, max(end for _, end, _ in pre), **stages)
        for stage, end, seconds in self.marks:
            if stage in ("model", "store"):
                self.child(stage, end - int(seconds * 1e9), end)
        self.span.set_attributes(attributes)
        self.span.end()

    def post_inference(self, start_ns: int, end_ns: int) -> None:
        """Post-inference ran for this response, after its terminal event (OTEL-3)."""
        self.child("post_inference", start_ns, end_ns)


def now_ns() -> int:
    return time.time_ns()
