"""The ``tokens`` upstream: the engine renders the model's own tokens and a token-in/token-out
server (vLLM, SGLang, llama.cpp) samples (SPEC: TOK-1..TOK-9).

Per sampling step: the new items are rendered once and appended to the rollout's trajectory
(``token_render``), the whole id array goes to the server's token endpoint (``token_wire``),
the sampled ids stream back, are decoded incrementally into text and read by the tool parser
into message text and function calls, and join the trajectory exactly as sampled.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from engine.conversation.context import Context
from engine.conversation.trajectory import Trajectory
from engine.models.base import (
    ArgsDelta,
    CallStart,
    Delta,
    Finish,
    FinishReason,
    SampleRequest,
    StepTokens,
    TextDelta,
)
from engine.models.compaction import Compacted, CompactRequest, summarise_with_model
from engine.models.tokens.render import TurnRenderer
from engine.models.tokens.tokenizer import ModelTokenizer
from engine.models.tokens.tool_parsers import PARSERS, ToolSchemas
from engine.models.tokens.wire import (
    PATHS,
    ChunkReader,
    Sampling,
    Step,
    TokenCountMismatch,
    body,
)
from engine.models.upstreams.chat import _with_namespace
from engine.models.upstreams.endpoint import (
    Endpoint,
    UpstreamError,
    closed_early,
    relay,
    retry_before_first,
)
from engine.models.upstreams.http_pool import HttpPool
from protocol.tools import Toolset

log = logging.getLogger("rollout.upstream.tokens")


@dataclass(frozen=True)
class TokensOptions:
    api: str = "vllm"
    model: str | None = None  # None: the client's model name
    tool_parser: str = "hermes"
    rerender: bool = False  # ``history = "rerender"`` (TOK-4)
    sglang_stream: str = "auto"  # auto | cumulative | incremental (TOK-32)
    params: dict[str, Any] = field(default_factory=dict)


class TokensBackend:
    name = "tokens"
    renders_own_tokens = True  # the pipeline only estimates counts (TOK-10)

    def __init__(
        self,
        endpoint: Endpoint,
        pool: HttpPool,
        tokenizer: ModelTokenizer,
        options: TokensOptions,
        supports: frozenset[str] = frozenset({"text"}),
    ) -> None:
        self.endpoint = endpoint
        self.pool = pool
        self.tokenizer = tokenizer
        self.options = options
        self.supports = supports
        self.renderer = TurnRenderer(tokenizer, options.rerender)
        self.stats: Counter[str] = self.renderer.stats  # renders, drift, requests …
        self.events: Counter[str] = Counter()  # the engine's, once bound (``count_into``)
        self.parser_factory = PARSERS[options.tool_parser]
        # Special tokens hidden from text: all but the parser's markers (TOK-30); once.
        self.hidden_ids = tokenizer.hidden_ids(self.parser_factory({}).markers)
        if not tokenizer.shape.append_only:
            log.warning("the chat template is not append-only: exact tokens are kept (TOK-4)")

    def stream(self, request: SampleRequest) -> AsyncGenerator[Delta, None]:
        """Renders once; a retried attempt resends the same ids."""
        ctx = request.context
        rendered = self.renderer.prompt(ctx, request.tools, ctx.model_tokens)
        ctx.model_tokens = trajectory = rendered.trajectory
        sampling = Sampling(
            model=self.options.model or request.model,
            max_tokens=request.max_output_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            params=dict(self.options.params),
        )
        payload = body(self.options.api, trajectory.ids_json, sampling)
        self.stats["requests"] += 1
        self.stats["prompt_ids_sent"] += len(trajectory)
        self.stats["prompt_ids_rendered"] += rendered.fresh

        def attempt(_number: int) -> AsyncGenerator[Delta, None]:
            answer = _TokenAnswer(self, ctx, trajectory, request.tools, rendered.fresh)
            return relay(self.pool, self.endpoint, PATHS[self.options.api], payload, answer)

        return retry_before_first(attempt, self.endpoint)

    def count_into(self, counters: Counter[str]) -> None:
        """Malformed calls and upstream count mismatches join the engine's counters, which
        ``/metrics`` serves as ``rollout_events_total`` (PARSE-3, TOK-33)."""
        counters.update(self.events)
        self.events = counters

    def count(self, event: str, n: int = 1) -> None:
        self.stats[event] += n
        self.events[event] += n

    async def compact(self, request: CompactRequest) -> Compacted:
        """COMPACT-5: the model writes the summary (a scratch context, rendered afresh)."""
        self.stats["compactions"] += 1
        return await summarise_with_model(self, request)


class _TokenAnswer:
    """One streamed generation: ids -> text -> parsed deltas; the ids join the trajectory when
    the answer is complete (a cut-off answer leaves the trajectory ``open``)."""

    def __init__(
        self,
        backend: TokensBackend,
        ctx: Context,
        trajectory: Trajectory,
        tools: Toolset,
        fresh: int,
    ) -> None:
        self._backend = backend
        self._fresh = fresh  # ids at the prompt's end rendered for this step
        self._ctx = ctx
        self._trajectory = trajectory
        self._tools = tools
        self._reader = ChunkReader(backend.options.api, backend.options.sglang_stream)
        self._decoder = backend.tokenizer.decoder(backend.hidden_ids)
        self._parser = backend.parser_factory(_schemas(tools))
        self._first_item = len(ctx.items)
        self.ids: list[int] = []
        self.logprobs: list[float | None] = []
        self.finish: str | None = None
        self.usage = Step()
        self.items = 0  # output items the rollout builds from our deltas
        self._in_message = False
        self.ended = False

    def feed(self, data: str) -> list[Delta]:
        step = self._reader.read(data)
        self._note(step)
        if step.ended:
            self.ended = True
        if not step.ids:
            return []
        self.ids.extend(step.ids)
        self.logprobs.extend(step.logprobs)
        text = "".join(self._decoder.step(token) for token in step.ids)
        return self._counted(self._parser.feed(text)) if text else []

    def _note(self, step: Step) -> None:
        if step.finish is not None:
            self.finish = step.finish
        usage = self.usage
        for name in ("prompt_tokens", "completion_tokens", "cached_tokens"):
            value = getattr(step, name)
            if value is not None:
                setattr(usage, name, value)

    def _counted(self, deltas: list[Delta]) -> list[Delta]:
        """Count the items the rollout opens: a message per run of text, one per call."""
        out: list[Delta] = []
        for delta in deltas:
            if isinstance(delta, TextDelta) and not self._in_message:
                self.items += 1
                self._in_message = True
            elif isinstance(delta, CallStart):
                self.items += 1
                self._in_message = False
            elif not isinstance(delta, TextDelta | ArgsDelta):
                self._in_message = False
            out.append(_with_namespace(delta, self._tools))
        return out

    def close(self) -> list[Delta]:
        if not self.ended and self.finish is None:
            raise closed_early()
        try:  # before the ids join: a short trajectory is never kept (TOK-33)
            self._reader.check(self.usage.completion_tokens)
        except TokenCountMismatch as exc:
            self.failed(exc)
            raise
        deltas = self._counted(self._parser.finish())
        if self._parser.malformed:
            name = self._backend.options.tool_parser
            self._backend.count(f"tokens.malformed_call.{name}", self._parser.malformed)
        prompt = self._trajectory.prompt
        view = self._trajectory.ids.view()
        step = StepTokens(
            prompt_tokens=prompt,
            prompt_new=view[prompt - self._fresh : prompt].tolist(),
            sampled=list(self.ids),
            logprobs=list(self.logprobs),
        )
        self._join()
        usage = self.usage
        reason: FinishReason = "stop"
        if self.finish == "length":
            reason = "length"
        elif self._parser.calls:
            reason = "tool_calls"
        deltas.append(
            Finish(
                reason,
                usage.completion_tokens if usage.completion_tokens is not None else len(self.ids),
                input_tokens=usage.prompt_tokens
                if usage.prompt_tokens is not None
                else self._trajectory.prompt,
                # Not reported: the prompt's ids sent before (none re-rendered this step).
                cached_tokens=usage.cached_tokens
                if usage.cached_tokens is not None
                else prompt - self._fresh,
                tokens=step,
            )
        )
        return deltas

    def _join(self) -> None:
        """The sampled ids join the trajectory exactly; the template's close is owed."""
        trajectory, tokenizer = self._trajectory, self._backend.tokenizer
        trajectory.sampled_ids(self.ids, self.logprobs)
        close = tokenizer.shape.close
        tail = close
        if self.ids and self.ids[-1] in tokenizer.end_ids:
            last = tokenizer.decode(self.ids[-1:])
            at = close.find(last)
            tail = close[at + len(last) :] if at >= 0 else ""
        trajectory.tail = tail
        trajectory.covered = self._first_item + self.items
        trajectory.answer_from = self._first_item
        sampled = tokenizer.decode(self.ids)
        trajectory.answer_text = tokenizer.shape.generation_prompt + sampled + tail
        trajectory.open = False
        self._backend.stats["sampled_ids"] += len(self.ids)

    def failed(self, exc: UpstreamError) -> None:
        """The trajectory stays open: the next turn renders the conversation afresh."""
        if isinstance(exc, TokenCountMismatch):
            self._backend.count(f"tokens.count_mismatch.{exc.api}")
            log.warning("upstream %s: %s", self._backend.endpoint.display, exc.message)


def _schemas(tools: Toolset) -> ToolSchemas:
    """Each function tool's ``parameters`` schema by name (qwen3_coder types values by it)."""
    return {t.name: t.parameters for t in tools.callables if t.parameters is not None}
