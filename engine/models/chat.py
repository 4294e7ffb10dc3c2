"""The ``chat`` upstream: any OpenAI-compatible ``/chat/completions`` server behind the engine
(vLLM, SGLang, llama.cpp server, Ollama, LM Studio, OpenAI). SPEC: UP-CHAT-1..UP-CHAT-8.

Each sampling step sends the rollout's full context (chat servers are stateless) and streams
the answer back as deltas. Mapping lives in ``chat_wire`` (request) and ``chat_stream``
(response chunks); this module is only the I/O loop.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import AsyncGenerator

import msgspec

from engine.models.base import Delta, SampleRequest
from engine.models.chat_stream import Chunk, ChunkMapper
from engine.models.chat_wire import ChatOptions, build_body
from engine.models.http_pool import HttpPool
from engine.models.upstream import (
    Endpoint,
    SseReader,
    UpstreamError,
    decode_json,
    drain,
    post_stream,
    retry_before_first,
    safe_message,
)

log = logging.getLogger("rollout.upstream.chat")
_DONE = "[DONE]"


class ChatBackend:
    name = "chat"

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

    async def _attempt(self, request: SampleRequest) -> AsyncGenerator[Delta, None]:
        payload = build_body(request, self.options)
        self.stats.update({f"dropped.{k}": v for k, v in payload.dropped.items()})
        self.stats["requests"] += 1
        body = msgspec.json.encode(payload.body)
        mapper = ChunkMapper()
        async with post_stream(self.pool, self.endpoint, "/chat/completions", body) as resp:
            reader = SseReader(resp)
            done = False
            while not done and (events := await reader.batch()):
                for event in events:
                    if event.data.strip() == _DONE:
                        done = True
                        break
                    for delta in mapper.feed(self._chunk(event.data)):
                        yield delta
            if done:
                await drain(resp)
        if not done and mapper.finish_reason is None:
            # The connection ended mid-answer (no finish_reason, no [DONE]): not a valid answer.
            raise UpstreamError("The model server closed the stream early.", retryable=True)
        for delta in mapper.finish():
            yield delta
        self._account(mapper)

    def _chunk(self, data: str) -> Chunk:
        chunk: Chunk = decode_json(data, Chunk)
        if chunk.error is not None:  # vLLM and OpenAI report mid-stream failures this way
            message = safe_message(msgspec.json.encode(chunk.error), (self.endpoint.api_key(),))
            log.warning("upstream %s stream error: %s", self.endpoint.display, message)
            raise UpstreamError("The model server reported an error mid-stream.")
        return chunk

    def _account(self, mapper: ChunkMapper) -> None:
        if mapper.usage is None:
            self.stats["usage_estimated"] += 1
        if mapper.reasoning_chunks:
            self.stats["dropped.reasoning_output"] += 1
