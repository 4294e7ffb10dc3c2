"""The three token-in/token-out upstream APIs: request bodies and stream chunks (pure; SPEC:
TOK-2). Each was written from the server's own source:

* vLLM ``POST /inference/v1/generate`` - ``vllm/entrypoints/serve/disagg/protocol.py``
  (``GenerateRequest``: ``token_ids``, ``sampling_params``, ``stream``, ``stream_options``) and
  ``serve/disagg/serving.py`` (``serve_tokens_stream_generator``: per chunk
  ``choices[0].token_ids`` (new ids), ``logprobs.content[].logprob``, ``finish_reason``; a last
  chunk with ``usage`` and no choices; ``data: [DONE]``).
* SGLang ``POST /generate`` - ``python/sglang/srt/managers/io_struct.py`` (``GenerateReqInput``:
  ``input_ids``, ``sampling_params``, ``stream``, ``return_logprob``) and
  ``tokenizer_manager_components/output_processor.py`` (``output_ids`` and
  ``meta_info.output_token_logprobs`` cumulative unless ``--incremental-streaming-output``;
  ``meta_info.finish_reason`` ``{"type": "stop"|"length"|"abort"}``, ``prompt_tokens``,
  ``completion_tokens``, ``cached_tokens``; ``data: [DONE]``).
* llama.cpp ``POST /completion`` - ``tools/server/server-task.cpp``
  (``to_json_non_oaicompat``: per chunk ``tokens`` (new ids, with ``return_tokens``),
  ``completion_probabilities[].logprob`` (with ``n_probs``), ``stop``; the last chunk has
  ``stop: true``, ``stop_type`` ``eos``/``limit``/``word``, ``tokens_predicted``,
  ``tokens_evaluated`` and ``timings.cache_n``).

The prompt's ids arrive as the JSON text of the array's elements (kept by the trajectory and
grown by appending), so building a body never re-encodes the history's ids one by one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from engine.models.upstreams.endpoint import UpstreamError, decode_json
from protocol.errors import failure_message

Api = Literal["vllm", "sglang", "llamacpp"]
PATHS: dict[str, str] = {
    "vllm": "/inference/v1/generate",
    "sglang": "/generate",
    "llamacpp": "/completion",
}
_PROMPT_KEY = {"vllm": b"token_ids", "sglang": b"input_ids", "llamacpp": b"prompt"}
# Fields the engine owns; a route's ``params`` can never override them.
RESERVED = frozenset(
    {
        "token_ids",
        "input_ids",
        "prompt",
        "stream",
        "stream_options",
        "return_logprob",
        "return_tokens",
        "n_probs",
        "logprobs",
        "n",
    }
)


@dataclass(frozen=True)
class Sampling:
    model: str
    max_tokens: int | None
    temperature: float | None
    top_p: float | None
    params: dict[str, Any] = field(default_factory=dict)
    stream: bool = True  # llama.cpp only: False asks for the whole answer at once (TOK-44)


def body(api: str, ids_json: bytes | bytearray, sampling: Sampling) -> bytes:
    """The request body with the prompt ids spliced in as already-encoded JSON."""
    fields = _fields(api, sampling)
    rest = msgspec.json.encode(fields)
    return b"".join((b'{"', _PROMPT_KEY[api], b'":[', bytes(ids_json), b"],", rest[1:]))


def _knobs(sampling: Sampling, max_key: str) -> dict[str, Any]:
    knobs: dict[str, Any] = {k: v for k, v in sampling.params.items() if k not in RESERVED}
    if sampling.max_tokens is not None:
        knobs[max_key] = sampling.max_tokens
    if sampling.temperature is not None:
        knobs["temperature"] = sampling.temperature
    if sampling.top_p is not None:
        knobs["top_p"] = sampling.top_p
    return knobs


def _fields(api: str, sampling: Sampling) -> dict[str, Any]:
    if api == "vllm":
        params = {**_knobs(sampling, "max_tokens"), "logprobs": 0}
        return {
            "model": sampling.model,
            "sampling_params": params,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    if api == "sglang":
        params = _knobs(sampling, "max_new_tokens")
        return {"sampling_params": params, "stream": True, "return_logprob": True}
    knobs = _knobs(sampling, "n_predict")
    # llama.cpp's stream never carries the id of a token whose text ends inside a UTF-8
    # character (tools/server/server-context.cpp, process_token), so by default it answers
    # whole, every id and its probability in one body (TOK-44).
    stream = sampling.stream
    return {**knobs, "stream": stream, "return_tokens": True, "n_probs": 1, "cache_prompt": True}


@dataclass
class Step:
    """What one chunk added: new sampled ids, their logprobs, and the end when it came."""

    ids: list[int] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)
    finish: str | None = None  # "stop" | "length" once the generation ended
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    ended: bool = False  # nothing more will come (``[DONE]`` or llama.cpp's ``stop``)


# --------------------------------------------------------------------------- vLLM


class _VLogprob(msgspec.Struct):
    logprob: float | None = None


class _VLogprobs(msgspec.Struct):
    content: list[_VLogprob] = []


class _VChoice(msgspec.Struct):
    token_ids: list[int] | None = None
    logprobs: _VLogprobs | None = None
    finish_reason: str | None = None


class _Details(msgspec.Struct):
    cached_tokens: int | None = None


class _VUsage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_tokens_details: _Details | None = None


class _VChunk(msgspec.Struct):
    choices: list[_VChoice] = []
    usage: _VUsage | None = None
    error: object | None = None


# --------------------------------------------------------------------------- SGLang


class _SMeta(msgspec.Struct):
    finish_reason: dict[str, Any] | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    output_token_logprobs: list[list[Any]] | None = None


class _SChunk(msgspec.Struct):
    output_ids: list[int] = []
    meta_info: _SMeta = msgspec.field(default_factory=_SMeta)
    error: object | None = None


# --------------------------------------------------------------------------- llama.cpp


class _LProb(msgspec.Struct):
    id: int | None = None
    logprob: float | None = None


class _LTimings(msgspec.Struct):
    cache_n: int | None = None
    prompt_n: int | None = None


class _LChunk(msgspec.Struct):
    tokens: list[int] = []
    completion_probabilities: list[_LProb] = []
    stop: bool = False
    stop_type: str | None = None
    tokens_predicted: int | None = None
    tokens_evaluated: int | None = None
    timings: _LTimings | None = None
    error: object | None = None


def _aligned(ids: list[int], probs: list[_LProb]) -> list[float | None]:
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


class TokenCountMismatch(UpstreamError):
    """The ids received are not the ids the server says it sampled (TOK-33): the step fails
    with its own code rather than leaving a silently short trajectory."""

    CODE = "upstream_token_mismatch"

    def __init__(self, api: str, received: int, reported: int) -> None:
        super().__init__(
            f"The model server reported {reported} sampled tokens but {received} arrived."
        )
        self.api = api

    def failure(self) -> str:
        return failure_message(self.CODE, self.message)


SglangStream = Literal["auto", "cumulative", "incremental"]


class ChunkReader:
    """Decodes one answer's chunks into ``Step`` s. SGLang streams either every id so far per
    chunk (cumulative, its default) or only the new ones (``--incremental-streaming-output``);
    ``auto`` tells them apart by ``meta_info.completion_tokens`` (TOK-32)."""

    def __init__(self, api: str, sglang_stream: str = "auto") -> None:
        self.api = api
        self.sglang_stream = sglang_stream
        self.received = 0  # ids returned so far

    def check(self, reported: int | None) -> None:
        """The answer is over: the ids received must be the count the server reported
        (vLLM ``usage.completion_tokens``, SGLang ``meta_info.completion_tokens``, llama.cpp
        ``tokens_predicted``), when it reported one (TOK-33)."""
        if reported is not None and reported != self.received:
            raise TokenCountMismatch(self.api, self.received, reported)

    def read(self, data: str) -> Step:
        if data.strip() == "[DONE]":
            return Step(ended=True)
        if self.api == "vllm":
            return self._vllm(decode_json(data, _VChunk))
        if self.api == "sglang":
            return self._sglang(decode_json(data, _SChunk))
        return self._llamacpp(decode_json(data, _LChunk))

    @staticmethod
    def _failed(error: object | None) -> None:
        if error is not None:
            raise UpstreamError("The model server reported an error mid-stream.")

    def _vllm(self, chunk: _VChunk) -> Step:
        self._failed(chunk.error)
        step = Step()
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

    def _sglang_shape(self, chunk: _SChunk) -> str:
        """Which shape this chunk has; ``auto`` settles it at the first chunk that can tell
        (one after ids arrived, with ``completion_tokens``) and keeps it."""
        if self.sglang_stream != "auto" or self.received == 0:
            return self.sglang_stream if self.sglang_stream != "auto" else "cumulative"
        total, size = chunk.meta_info.completion_tokens, len(chunk.output_ids)
        if total is None:
            return "cumulative"  # nothing to tell by: SGLang's default
        if size == total:
            self.sglang_stream = "cumulative"
        elif self.received + size == total:
            self.sglang_stream = "incremental"
        else:
            raise TokenCountMismatch(self.api, self.received + size, total)
        return self.sglang_stream

    def _sglang(self, chunk: _SChunk) -> Step:
        self._failed(chunk.error)
        meta = chunk.meta_info
        logprobs = meta.output_token_logprobs or []
        if self._sglang_shape(chunk) == "cumulative":
            if len(chunk.output_ids) < self.received:
                raise TokenCountMismatch(self.api, self.received, len(chunk.output_ids))
            ids, logprobs = chunk.output_ids[self.received :], logprobs[self.received :]
        else:  # SGLang slices the logprobs to the new ids too
            ids = chunk.output_ids
        self.received += len(ids)
        lps = [row[0] if row else None for row in logprobs[: len(ids)]]
        step = Step(ids=list(ids), logprobs=lps + [None] * (len(ids) - len(lps)))
        if meta.finish_reason is not None:
            kind = meta.finish_reason.get("type")
            if kind == "abort":
                raise UpstreamError("The model server aborted the generation.")
            step.finish = "length" if kind == "length" else "stop"
            step.prompt_tokens, step.completion_tokens = meta.prompt_tokens, meta.completion_tokens
            step.cached_tokens = meta.cached_tokens
        return step

    def _llamacpp(self, chunk: _LChunk) -> Step:
        self._failed(chunk.error)
        ids = list(chunk.tokens)
        self.received += len(ids)
        # ``tokens_predicted`` counts every id sampled so far: a gap (llama.cpp does not stream
        # the ids of a token whose text is an incomplete UTF-8 sequence) fails now (TOK-33).
        if not chunk.stop:
            self.check(chunk.tokens_predicted)
        step = Step(ids=ids, logprobs=_aligned(ids, chunk.completion_probabilities))
        if chunk.stop:
            step.ended = True
            step.finish = "length" if chunk.stop_type == "limit" else "stop"
            step.prompt_tokens, step.completion_tokens = (
                chunk.tokens_evaluated,
                chunk.tokens_predicted,
            )
            step.cached_tokens = chunk.timings.cache_n if chunk.timings is not None else None
        return step
