"""vLLM ``POST /inference/v1/generate`` (SPEC: TOK-2), written from
``vllm/entrypoints/serve/disagg/protocol.py`` (``GenerateRequest``: ``token_ids``,
``sampling_params``, ``stream``, ``stream_options``) and ``serve/disagg/serving.py``
(``serve_tokens_stream_generator``: per chunk ``choices[0].token_ids`` (new ids),
``logprobs.content[].logprob``, ``finish_reason``; a last chunk with ``usage`` and no choices;
``data: [DONE]``)."""

from __future__ import annotations

from typing import Any

import msgspec

from engine.models.tokens.servers.base import ChunkReader, ChunkStep, Sampling, TokenServer, knobs
from engine.models.upstreams.endpoint import decode_json


class _Logprob(msgspec.Struct):
    logprob: float | None = None


class _Logprobs(msgspec.Struct):
    content: list[_Logprob] = []


class _Choice(msgspec.Struct):
    token_ids: list[int] | None = None
    logprobs: _Logprobs | None = None
    finish_reason: str | None = None


class _Details(msgspec.Struct):
    cached_tokens: int | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_tokens_details: _Details | None = None


class _Chunk(msgspec.Struct):
    choices: list[_Choice] = []
    usage: _Usage | None = None
    error: object | None = None


class VllmReader(ChunkReader):
    def chunk(self, data: str) -> ChunkStep:
        chunk = decode_json(data, _Chunk)
        self.failed(chunk.error)
        step = ChunkStep()
        for choice in chunk.choices:
            ids = choice.token_ids or []
            self.received += len(ids)
            step.ids.extend(ids)
            content = choice.logprobs.content if choice.logprobs is not None else []
            lps: list[float | None] = [c.logprob for c in content[: len(ids)]]
            step.logprobs.extend(lps + [None] * (len(ids) - len(lps)))
            if choice.finish_reason is not None:
                step.finish = "length" if choice.finish_reason == "length" else "stop"
        if chunk.usage is not None:
            usage = chunk.usage
            step.prompt_tokens = usage.prompt_tokens
            step.completion_tokens = usage.completion_tokens
            details = usage.prompt_tokens_details
            step.cached_tokens = details.cached_tokens if details is not None else None
        return step


class VllmServer(TokenServer):
    name = "vllm"
    path = "/inference/v1/generate"
    prompt_key = b"token_ids"

    def fields(self, sampling: Sampling) -> dict[str, Any]:
        params = {**knobs(sampling, "max_tokens"), "logprobs": 0}
        return {
            "model": sampling.model,
            "sampling_params": params,
            "stream": True,
            "stream_options": {"include_usage": True},
        }

    def reader(self) -> ChunkReader:
        return VllmReader(self.name)
