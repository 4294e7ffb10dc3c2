"""The ``chat`` upstream: any OpenAI-compatible ``/chat/completions`` server behind the engine
(vLLM, SGLang, llama.cpp server, Ollama, LM Studio, OpenAI). SPEC: UP-CHAT-1..UP-CHAT-8.

Each sampling step sends the rollout's full context (chat servers are stateless) and streams
the answer back as deltas. Mapping lives in ``chat_wire`` (request) and ``chat_stream``
(response chunks); this module is only the I/O loop.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import AsyncGenerator

import msgspec

from engine.models.base import Backend, CallStart, Delta, SampleRequest
from engine.models.compaction import Compacted, CompactRequest, summarise_with_model
from engine.models.upstreams.chat_stream import Chunk, ChunkMapper
from engine.models.upstreams.chat_wire import ChatOptions, build_body
from engine.models.upstreams.endpoint import (
    Endpoint,
    UpstreamError,
    closed_early,
    decode_json,
    relay,
    retry_before_first,
    safe_message,
)
from engine.models.upstreams.http_pool import HttpPool
from protocol.tools import Toolset

log = logging.getLogger("rollout.upstream.chat")
_DONE = "[DONE]"


class ChatBackend(Backend):
    name = "chat"
    reports_usage = True  # the upstream counts the prompt: ours is an estimate (UP-8)

    def __init__(
        self,
        endpoint: Endpoint,
        pool: HttpPool,
        options: ChatOptions | None = None,
        supports: frozenset[str] = frozenset({"text"}),
    ) -> None:
        self.endpoint = endpoint
        self.pool = pool
        self.options = options or ChatOptions()
        self.supports = supports
        self.stats: Counter[str] = Counter()  # requests, dropped items, estimated usage …

    def stream(self, request: SampleRequest) -> AsyncGenerator[Delta, None]:
        return retry_before_first(lambda _attempt: self._attempt(request), self.endpoint)

    async def compact(self, request: CompactRequest) -> Compacted:
        """COMPACT-5: a chat server has no compaction of its own; its model writes the summary."""
        self.stats["compactions"] += 1
        return await summarise_with_model(self, request)

    def _attempt(self, request: SampleRequest) -> AsyncGenerator[Delta, None]:
        payload = build_body(request, self.options)
        self.stats.update({f"dropped.{k}": v for k, v in payload.dropped.items()})
        self.stats["requests"] += 1
        body = msgspec.json.encode(payload.body)
        answer = _ChatAnswer(self, request.tools)
        return relay(self.pool, self.endpoint, "/chat/completions", body, answer)


class _ChatAnswer:
    """A chat-completions stream: chunks until ``[DONE]``."""

    def __init__(self, backend: ChatBackend, tools: Toolset) -> None:
        self._backend = backend
        self._tools = tools
        self._chunks = ChunkMapper()
        self.ended = False

    def feed(self, data: str) -> list[Delta]:
        if data.strip() == _DONE:
            self.ended = True
            return []
        return [_with_namespace(d, self._tools) for d in self._chunks.feed(self._chunk(data))]

    def close(self) -> list[Delta]:
        mapper = self._chunks
        if not self.ended and mapper.finish_reason is None:
            raise closed_early()  # no finish_reason and no [DONE]: cut off mid-answer
        deltas = mapper.finish()
        stats = self._backend.stats
        if mapper.usage is None:
            stats["usage_estimated"] += 1
        if mapper.reasoning_chunks:
            stats["dropped.reasoning_output"] += 1
        return deltas

    def failed(self, exc: UpstreamError) -> None:
        """Nothing to note: a chat request is the same on every attempt."""

    def _chunk(self, data: str) -> Chunk:
        chunk: Chunk = decode_json(data, Chunk)
        if chunk.error is not None:  # vLLM and OpenAI report mid-stream failures this way
            endpoint = self._backend.endpoint
            message = safe_message(msgspec.json.encode(chunk.error), (endpoint.api_key(),))
            log.warning("upstream %s stream error: %s", endpoint.display, message)
            raise UpstreamError("The model server reported an error mid-stream.")
        return chunk


def _with_namespace(delta: Delta, tools: Toolset) -> Delta:
    """Chat servers see namespaced functions by their plain name (UP-CHAT-4); a call of one
    gets its ``namespace`` back here (TOOL-2)."""
    if isinstance(delta, CallStart) and delta.namespace is None:
        tool = tools.find(delta.name)
        if tool is not None and tool.namespace is not None:
            return dataclasses.replace(delta, namespace=tool.namespace)
    return delta
