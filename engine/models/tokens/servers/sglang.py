"""SGLang ``POST /generate`` (SPEC: TOK-2, TOK-32), written from
``python/sglang/srt/managers/io_struct.py`` (``GenerateReqInput``: ``input_ids``,
``sampling_params``, ``stream``, ``return_logprob``) and
``tokenizer_manager_components/output_processor.py`` (``output_ids`` and
``meta_info.output_token_logprobs`` cumulative unless ``--incremental-streaming-output``;
``meta_info.finish_reason`` ``{"type": "stop"|"length"|"abort"}``, ``prompt_tokens``,
``completion_tokens``, ``cached_tokens``; ``data: [DONE]``). Its option: ``sglang_stream``."""

from __future__ import annotations

from typing import Any

import msgspec

from engine.models.tokens.servers.base import (
    ChunkReader,
    ChunkStep,
    Sampling,
    TokenCountMismatch,
    TokenServer,
    knobs,
)
from engine.models.upstreams.endpoint import UpstreamError, decode_json


class _Meta(msgspec.Struct):
    finish_reason: dict[str, Any] | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    output_token_logprobs: list[list[Any]] | None = None


class _Chunk(msgspec.Struct):
    output_ids: list[int] = []
    meta_info: _Meta = msgspec.field(default_factory=_Meta)
    error: object | None = None


class SglangReader(ChunkReader):
    """SGLang streams either every id so far per chunk (cumulative, its default) or only the
    new ones (``--incremental-streaming-output``); ``auto`` tells them apart by
    ``meta_info.completion_tokens`` (TOK-32)."""

    def __init__(self, api: str, shape: str = "auto") -> None:
        super().__init__(api)
        self.shape = shape

    def _shape(self, chunk: _Chunk) -> str:
        """Which shape this chunk has; ``auto`` settles it at the first chunk that can tell
        (one after ids arrived, with ``completion_tokens``) and keeps it."""
        if self.shape != "auto" or self.received == 0:
            return self.shape if self.shape != "auto" else "cumulative"
        total, size = chunk.meta_info.completion_tokens, len(chunk.output_ids)
        if total is None:
            return "cumulative"  # nothing to tell by: SGLang's default
        if size == total:
            self.shape = "cumulative"
        elif self.received + size == total:
            self.shape = "incremental"
        else:
            raise TokenCountMismatch(self.api, self.received + size, total)
        return self.shape

    def chunk(self, data: str) -> ChunkStep:
        chunk = decode_json(data, _Chunk)
        self.failed(chunk.error)
        meta = chunk.meta_info
        logprobs = meta.output_token_logprobs or []
        if self._shape(chunk) == "cumulative":
            if len(chunk.output_ids) < self.received:
                raise TokenCountMismatch(self.api, self.received, len(chunk.output_ids))
            ids, logprobs = chunk.output_ids[self.received :], logprobs[self.received :]
        else:  # SGLang slices the logprobs to the new ids too
            ids = chunk.output_ids
        self.received += len(ids)
        lps = [row[0] if row else None for row in logprobs[: len(ids)]]
        step = ChunkStep(ids=list(ids), logprobs=lps + [None] * (len(ids) - len(lps)))
        if meta.finish_reason is not None:
            kind = meta.finish_reason.get("type")
            if kind == "abort":
                raise UpstreamError("The model server aborted the generation.")
            step.finish = "length" if kind == "length" else "stop"
            step.prompt_tokens, step.completion_tokens = meta.prompt_tokens, meta.completion_tokens
            step.cached_tokens = meta.cached_tokens
        return step


class SglangServer(TokenServer):
    name = "sglang"
    path = "/generate"
    prompt_key = b"input_ids"

    def fields(self, sampling: Sampling) -> dict[str, Any]:
        params = knobs(sampling, "max_new_tokens")
        return {"sampling_params": params, "stream": True, "return_logprob": True}

    def reader(self) -> ChunkReader:
        return SglangReader(self.name, self.options.sglang_stream)
