"""The ``responses`` upstream: an HTTP-only Responses server (e.g. vLLM's ``/v1/responses``)
behind the engine, which then adds the WebSocket mode, the connection cache and append mode.
SPEC: UP-RESP-1..UP-RESP-5.

Every sampling step sends the full context, unless the route is configured ``continue_by_id``:
then a rollout's next step sends only the items added since the previous step, with that
step's upstream response id as ``previous_response_id``. A rollout forked from the cache starts
a fresh chain (full context again), and a continuation the upstream no longer knows falls back
to the full context once.
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

import msgspec

from engine.conversation.context import Context
from engine.models.base import HOSTED_TOOLS, Backend, Delta, SampleRequest
from engine.models.compaction import Compacted, CompactRequest
from engine.models.upstreams.endpoint import (
    Endpoint,
    UpstreamError,
    closed_early,
    decode_json,
    post_stream,
    relay,
    retry_before_first,
)
from engine.models.upstreams.http_pool import HttpPool
from engine.models.upstreams.responses_wire import (
    RESERVED,
    CompactedBody,
    Event,
    EventMapper,
    ResponsesOptions,
    compacted_from,
    input_items,
    tool_choice_for,
)

MAX_COMPACTED_BYTES = 32 * 1024 * 1024  # an upstream's compacted window, read at most


@dataclass(frozen=True, slots=True)
class _Link:
    """Where a rollout's chain stands: the upstream id and how many of our items it covers."""

    response_id: str
    covered: int


class ResponsesBackend(Backend):
    name = "responses"
    reports_usage = True  # the upstream counts the prompt: ours is an estimate (UP-8)

    def __init__(
        self,
        endpoint: Endpoint,
        pool: HttpPool,
        options: ResponsesOptions | None = None,
        supports: frozenset[str] = frozenset({"text"}),
    ) -> None:
        self.endpoint = endpoint
        self.pool = pool
        self.options = options or ResponsesOptions()
        self.supports = supports | {HOSTED_TOOLS}  # the upstream runs hosted tools (TOOL-4)
        self.stats: Counter[str] = Counter()
        self._links: dict[int, _Link] = {}  # id(Context) -> link; dropped when it is collected

    def stream(self, request: SampleRequest) -> AsyncGenerator[Delta, None]:
        return retry_before_first(lambda n: self._attempt(request, n), self.endpoint)

    def _attempt(self, request: SampleRequest, number: int) -> AsyncGenerator[Delta, None]:
        link = self._links.get(id(request.context)) if self.options.continue_by_id else None
        if link is not None and number > 0:
            link = None  # a failed continuation is retried with the full context
        body = msgspec.json.encode(self._body(request, link))
        answer = _ResponsesAnswer(self, request.context, link)
        return relay(self.pool, self.endpoint, "/responses", body, answer)

    async def compact(self, request: CompactRequest) -> Compacted:
        """COMPACT-5: forwarded to the upstream's ``/responses/compact``; its window (its own
        ``compaction`` item included) replaces ours as it is."""
        ctx = request.context
        dropped: Counter[str] = Counter()
        body: dict[str, Any] = {"model": self.options.model or request.model}
        body["input"] = input_items(ctx, 0, self.options.pass_reasoning, dropped)
        if ctx.header_key is not None and ctx.header_key[0]:
            body["instructions"] = ctx.header_key[0]
        self.stats["compactions"] += 1
        payload = msgspec.json.encode(body)
        async with post_stream(self.pool, self.endpoint, "/responses/compact", payload) as resp:
            raw = await resp.read(MAX_COMPACTED_BYTES)
        return compacted_from(decode_json(raw.decode(errors="replace"), CompactedBody), ctx)

    def _body(self, request: SampleRequest, link: _Link | None) -> dict[str, Any]:
        dropped: Counter[str] = Counter()
        opts = self.options
        body: dict[str, Any] = {"model": opts.model or request.model, "stream": True}
        body["store"] = opts.continue_by_id
        start = 0
        if link is not None:
            body["previous_response_id"] = link.response_id
            start = link.covered
        body["input"] = input_items(request.context, start, opts.pass_reasoning, dropped)
        header = request.context.header_key
        if header is not None and header[0]:
            body["instructions"] = header[0]
        if request.tools:
            body["tools"] = list(request.tools.raw)  # forwarded exactly as sent (TOOL-1)
            body["tool_choice"] = tool_choice_for(request.tool_choice)
            body["parallel_tool_calls"] = request.parallel_tool_calls
        _set_optional(body, request)
        for key, value in opts.params.items():
            if key not in RESERVED:
                body.setdefault(key, value)
        self.stats["requests"] += 1
        if dropped:  # rare; ``Counter.update`` costs microseconds even when given nothing
            self.stats.update({f"dropped.{k}": v for k, v in dropped.items()})
        return body

    def remember_link(self, ctx: Context, mapper: EventMapper) -> None:
        if not self.options.continue_by_id or mapper.response_id is None:
            return
        key = id(ctx)
        if key not in self._links:
            weakref.finalize(ctx, self._links.pop, key, None)
        # After this step the rollout absorbs our output items; the upstream already has them.
        self._links[key] = _Link(mapper.response_id, len(ctx.items) + mapper.items)


class _ResponsesAnswer:
    """A Responses event stream: events until the terminal one (completed, incomplete,
    failed)."""

    def __init__(self, backend: ResponsesBackend, ctx: Context, link: _Link | None) -> None:
        self._backend = backend
        self._ctx = ctx
        self._link = link
        self._events = EventMapper((backend.endpoint.api_key(),))

    @property
    def ended(self) -> bool:
        return self._events.final is not None

    def feed(self, data: str) -> list[Delta]:
        return self._events.feed(decode_json(data, Event))

    def close(self) -> list[Delta]:
        mapper, stats = self._events, self._backend.stats
        if mapper.final is None:
            raise closed_early()
        if mapper.skipped:
            stats.update({f"skipped.{k}": v for k, v in mapper.skipped.items()})
        stats["usage_estimated"] += int(mapper.final.usage_estimated)
        self._backend.remember_link(self._ctx, mapper)
        return [mapper.final]

    def failed(self, exc: UpstreamError) -> None:
        if self._link is not None and exc.rejected:
            self._backend.stats["continuation_rejected"] += 1
            exc.fallback = True  # the next attempt sends the full context instead


def _set_optional(body: dict[str, Any], request: SampleRequest) -> None:
    if request.max_output_tokens is not None:
        body["max_output_tokens"] = request.max_output_tokens
    if request.temperature is not None:
        body["temperature"] = request.temperature
    if request.top_p is not None:
        body["top_p"] = request.top_p
