"""What every token-in/token-out server shares (SPEC: TOK-2): the sampling knobs, what one
chunk adds (``ChunkStep``), the count check (TOK-33), and ``TokenServer``, whose subclasses (one
module each: ``vllm.py``, ``sglang.py``, ``llamacpp.py``, registered in ``servers/__init__.py``)
own their path, body fields, chunk reader and options. Each was written from the server's own
source, named in its module.

The prompt's ids arrive as the JSON text of the array's elements (kept by the trajectory and
grown by appending), so building a body never re-encodes the history's ids one by one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import msgspec

from engine.models.tokens.options import TokensOptions
from engine.models.upstreams.endpoint import UpstreamError
from protocol.errors import failure_message

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


def knobs(sampling: Sampling, max_key: str) -> dict[str, Any]:
    """The route's ``params`` (never a reserved field) and the request's sampling knobs, the
    output limit under the server's own name."""
    out: dict[str, Any] = {k: v for k, v in sampling.params.items() if k not in RESERVED}
    if sampling.max_tokens is not None:
        out[max_key] = sampling.max_tokens
    if sampling.temperature is not None:
        out["temperature"] = sampling.temperature
    if sampling.top_p is not None:
        out["top_p"] = sampling.top_p
    return out


@dataclass
class ChunkStep:
    """What one chunk added: new sampled ids, their logprobs, and the end when it came."""

    ids: list[int] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)
    finish: str | None = None  # "stop" | "length" once the generation ended
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    ended: bool = False  # nothing more will come (``[DONE]`` or llama.cpp's ``stop``)


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


class ChunkReader(ABC):
    """Decodes one answer's chunks into ``ChunkStep`` s; a server's subclass reads its own shape."""

    def __init__(self, api: str) -> None:
        self.api = api
        self.received = 0  # ids returned so far

    def check(self, reported: int | None) -> None:
        """The answer is over: the ids received must be the count the server reported, when
        it reported one (TOK-33)."""
        if reported is not None and reported != self.received:
            raise TokenCountMismatch(self.api, self.received, reported)

    def read(self, data: str) -> ChunkStep:
        if data.strip() == "[DONE]":
            return ChunkStep(ended=True)
        return self.chunk(data)

    @abstractmethod
    def chunk(self, data: str) -> ChunkStep:
        """One chunk's JSON text -> what it added."""

    @staticmethod
    def failed(error: object | None) -> None:
        if error is not None:
            raise UpstreamError("The model server reported an error mid-stream.")


class TokenServer(ABC):
    """One token-in/token-out server: where it is asked, what it is sent, how it answers."""

    name: ClassVar[str]  # the route's ``api``
    path: ClassVar[str]  # its token endpoint
    prompt_key: ClassVar[bytes]  # the body field that carries the prompt's ids

    def __init__(self, options: TokensOptions) -> None:
        self.options = options

    def body(self, ids_json: bytes | bytearray, sampling: Sampling) -> bytes:
        """The request body with the prompt ids spliced in as already-encoded JSON."""
        rest = msgspec.json.encode(self.fields(sampling))
        # ``join`` reads the bytearray in place: no copy of the history's bytes before it
        return b"".join((b'{"', self.prompt_key, b'":[', ids_json, b"],", rest[1:]))

    @abstractmethod
    def fields(self, sampling: Sampling) -> dict[str, Any]:
        """The body's fields besides the prompt."""

    @abstractmethod
    def reader(self) -> ChunkReader:
        """A reader for one answer's chunks."""
