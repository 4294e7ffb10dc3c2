"""The W3C ``traceparent`` of the model call being made (SPEC: OTEL-4).

A context variable, so the rollout sets it for its own task and an upstream request made from
that task carries it, with no parameter through every backend. A leaf of the models room: the
upstreams read it, the tracing (``engine/observe/tracing.py``) sets it. None (the default, and
always with tracing off): no header is added.
"""

from __future__ import annotations

from contextvars import ContextVar

TRACEPARENT: ContextVar[str | None] = ContextVar("traceparent", default=None)
