"""llama.cpp ``POST /completion`` (SPEC: TOK-2, TOK-44), written from
``tools/server/server-task.cpp`` (``to_json_non_oaicompat``: per chunk ``tokens`` (new ids, with
``return_tokens``), ``completion_probabilities[].logprob`` (with ``n_probs``), ``stop``; the last
chunk has ``stop: true``, ``stop_type`` ``eos``/``limit``/``word``, ``tokens_predicted``,
``tokens_evaluated`` and ``timings.cache_n``). Its option: ``llamacpp_stream``."""

from __future__ import annotations

from typing import Any

import msgspec

from engine.models.tokens.servers.base import ChunkReader, ChunkStep, Sampling, TokenServer, knobs
from engine.models.upstreams.endpoint import decode_json


class _Prob(msgspec.Struct):
    id: int | None = None
    logprob: float | None = None


class _Timings(msgspec.Struct):
    cache_n: int | None = None
    prompt_n: int | None = None


class _Chunk(msgspec.Struct):
    tokens: list[int] = []
    completion_probabilities: list[_Prob] = []
    stop: bool = False
    stop_type: str | None = None
    tokens_predicted: int | None = None
    tokens_evaluated: int | None = None
    timings: _Timings | None = None
    error: object | None = None


def _aligned(ids: list[int], probs: list[_Prob]) -> list[float | None]:
    """One logprob per id. llama.cpp keeps no probability for a token whose text ends inside a
    UTF-8 character (its ``add_token`` is skipped), so ``probs`` is a subsequence of ``ids``:
    matched in order by id, the ids it skipped get None (TOK-44)."""
    out: list[float | None] = []
    at = 0
    for token in ids:
        if at < len(probs) and probs[at].id in (token, None):
            out.append(probs[at].logprob)
            at += 1
        else:
            out.append(None)
    return out


class LlamacppReader(ChunkReader):
    def chunk(self, data: str) -> ChunkStep:
        chunk = decode_json(data, _Chunk)
        self.failed(chunk.error)
        ids = list(chunk.tokens)
        self.received += len(ids)
        # ``tokens_predicted`` counts every id sampled so far: a gap (llama.cpp does not stream
        # the ids of a token whose text is an incomplete UTF-8 sequence) fails now (TOK-33).
        if not chunk.stop:
            self.check(chunk.tokens_predicted)
        step = ChunkStep(ids=ids, logprobs=_aligned(ids, chunk.completion_probabilities))
        if chunk.stop:
            step.ended = True
            step.finish = "length" if chunk.stop_type == "limit" else "stop"
            step.prompt_tokens, step.completion_tokens = (
                chunk.tokens_evaluated,
                chunk.tokens_predicted,
            )
            step.cached_tokens = chunk.timings.cache_n if chunk.timings is not None else None
        return step


class LlamacppServer(TokenServer):
    name = "llamacpp"
    path = "/completion"
    prompt_key = b"prompt"

    def fields(self, sampling: Sampling) -> dict[str, Any]:
        # llama.cpp's stream never carries the id of a token whose text ends inside a UTF-8
        # character (tools/server/server-context.cpp, process_token), so by default it answers
        # whole, every id and its probability in one body (TOK-44).
        stream = self.options.llamacpp_stream
        return {
            **knobs(sampling, "n_predict"),
            "stream": stream,
            "return_tokens": True,
            "n_probs": 1,
            "cache_prompt": True,
        }

    def reader(self) -> ChunkReader:
        return LlamacppReader(self.name)
