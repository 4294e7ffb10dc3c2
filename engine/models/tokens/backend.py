"""The ``tokens`` upstream: the engine renders the model's own tokens and a token-in/token-out
server (vLLM, SGLang, llama.cpp) samples (SPEC: TOK-1..TOK-9).

Per sampling step: the new items are rendered once and appended to the rollout's trajectory
(the route's renderer, ``render.py``: ``jinja.py`` or ``harmony.py``), the whole id array goes
to the route's token server (``servers/``), the sampled ids stream back, are read into
reasoning, message text and function calls (the route's reasoning parser, ``reasoning.py``:
``think.py``, ``harmony.py``, with its tool parser, ``tool_parsers.py``), and join the
trajectory exactly as sampled. Each format is named by the route and looked up in its registry.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import AsyncGenerator

from engine.conversation.context import Context
from engine.conversation.trajectory import Trajectory
from engine.models.base import (
    ArgsDelta,
    Backend,
    CallStart,
    Delta,
    Finish,
    FinishReason,
    ReasoningDelta,
    SampleRequest,
    StepTokens,
    TextDelta,
)
from engine.models.compaction import Compacted, CompactRequest, summarise_with_model
from engine.models.tokens.carried import continued
from engine.models.tokens.options import TokensOptions
from engine.models.tokens.reasoning import reasoning_parser
from engine.models.tokens.render import RENDERERS, SampledAnswer
from engine.models.tokens.sealed import replayed
from engine.models.tokens.servers import SERVERS
from engine.models.tokens.servers.base import ChunkStep, Sampling, TokenCountMismatch
from engine.models.tokens.tokenizer import ModelTokenizer
from engine.models.tokens.tool_parsers import ToolSchemas
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


class TokensBackend(Backend):
    name = "tokens"
    renders_own_tokens = True  # the pipeline only estimates counts (TOK-10)

    def __init__(
        self,
        endpoint: Endpoint,
        pool: HttpPool,
        tokenizer: ModelTokenizer | None,
        options: TokensOptions,
        supports: frozenset[str] = frozenset({"text"}),
    ) -> None:
        self.endpoint = endpoint
        self.pool = pool
        self.tokenizer = tokenizer
        self.options = options
        self.supports = supports
        self.weights = options.weights  # stored with each trajectory segment (EXPORT-4)
        self.training_fields = options.training_fields  # TOK-61
        self.server = SERVERS[options.api](options)  # TOK-2
        self.renderer = RENDERERS[options.template].build(tokenizer, options.rerender)
        self.stats: Counter[str] = self.renderer.stats  # renders, drift, requests …
        self.events: Counter[str] = Counter()  # the engine's, once bound (``count_into``)
        # REASON-1, HARMONY-3: what reads the sampled ids (the route's tool parser inside)
        self.reasoning = reasoning_parser(
            options.reasoning_parser, self.renderer, options.tool_parser, self.stats
        )

    def stream(self, request: SampleRequest) -> AsyncGenerator[Delta, None]:
        """Renders once; a retried attempt resends the same ids."""
        ctx = request.context
        if ctx.carried:  # a continuation that had its trajectory already (TOK-62)
            ctx.carried = None
        rendered = (
            replayed(self.renderer, ctx, request.tools, request.model) if ctx.sealed else None
        )
        if rendered is None:  # no sealed runs to continue from (SEAL-4)
            rendered = self.renderer.prompt(ctx, request.tools, ctx.model_tokens)
        ctx.model_tokens = trajectory = rendered.trajectory
        sampling = Sampling(
            model=self.options.model or request.model,
            max_tokens=request.max_output_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            params=dict(self.options.params),
        )
        payload = self.server.body(trajectory.ids_json, sampling)
        self.stats["requests"] += 1
        self.stats["prompt_ids_sent"] += len(trajectory)
        self.stats["prompt_ids_rendered"] += rendered.fresh

        answers: list[_TokenAnswer] = []  # the latest attempt's: what a cut answer keeps

        def attempt(_number: int) -> AsyncGenerator[Delta, None]:
            answer = _TokenAnswer(self, ctx, trajectory, request.tools, rendered.fresh)
            answers[:] = [answer]
            return relay(self.pool, self.endpoint, self.server.path, payload, answer)

        return _kept(answers, retry_before_first(attempt, self.endpoint))

    def continue_carried(self, ctx: Context, tools: Toolset) -> None:
        """TOK-62, TOK-63: the trajectory rebuilt from the carried runs, checked."""
        trajectory = continued(self.renderer, self.reasoning, ctx, tools)
        if trajectory is not None:
            ctx.model_tokens = trajectory

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


async def _kept(
    answers: list[_TokenAnswer], deltas: AsyncGenerator[Delta, None]
) -> AsyncGenerator[Delta, None]:
    """An answer that ends before its end keeps what was sampled in the trajectory (TOK-43):
    ``error`` when the model server failed, ``cancelled`` when the engine stopped it."""
    reason = "cancelled"
    try:
        async with contextlib.aclosing(deltas):
            async for delta in deltas:
                yield delta
    except Exception:
        reason = "error"
        raise
    finally:
        if answers:
            answers[-1].cut(reason)


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
        self._reader = backend.server.reader()
        self._parsing = backend.reasoning.reader(_schemas(tools))
        self._first_item = len(ctx.items)
        self.ids: list[int] = []
        self.logprobs: list[float | None] = []
        self.finish: str | None = None
        self.usage = ChunkStep()
        self.items = 0  # output items the rollout builds from our deltas
        self._open: type[Delta] | None = None  # the kind of text item our deltas keep open
        self.ended = False
        self._joined = False

    def feed(self, data: str) -> list[Delta]:
        step = self._reader.read(data)
        self._note(step)
        if step.ended:
            self.ended = True
        if not step.ids:
            return []
        self.ids.extend(step.ids)
        self.logprobs.extend(step.logprobs)
        return self._counted(self._parsing.feed(step.ids))

    def _note(self, step: ChunkStep) -> None:
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
            if isinstance(delta, TextDelta | ReasoningDelta):
                if self._open is not type(delta):
                    self.items += 1
                    self._open = type(delta)
            elif isinstance(delta, CallStart):
                self.items += 1
                self._open = None
            elif not isinstance(delta, ArgsDelta):
                self._open = None
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
        deltas = self._counted(self._parsing.finish())
        if self._parsing.malformed:
            name = self._backend.reasoning.call_parser
            self._backend.count(f"tokens.malformed_call.{name}", self._parsing.malformed)
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
        elif self._parsing.calls:
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
                reasoning_tokens=self._parsing.reasoning_tokens,
            )
        )
        return deltas

    def _join(self) -> None:
        """The sampled ids join the trajectory exactly (the renderer knows what is owed)."""
        self._joined = True
        calls = self._parsing.calls
        finish = "length" if self.finish == "length" else "tool" if calls else "stop"
        # An item cut by the output limit stays out of the context (ORD-8 keeps it only in the
        # response), so the trajectory stands for the items before it (TOK-43).
        cut_item = int(self.finish == "length" and self._open is not None)
        covered = self._first_item + self.items - cut_item
        answer_from = -1 if cut_item else self._first_item
        answer = SampledAnswer(
            self.ids, self.logprobs, answer_from, covered, self._parsing.ended_in_call, finish
        )
        self._backend.renderer.join(self._trajectory, answer)
        self._backend.stats["sampled_ids"] += len(self.ids)

    def failed(self, exc: UpstreamError) -> None:
        """The trajectory stays open: the next turn renders the conversation afresh."""
        if isinstance(exc, TokenCountMismatch):
            self._backend.count(f"tokens.count_mismatch.{exc.api}")
            log.warning("upstream %s: %s", self._backend.endpoint.display, exc.message)

    def cut(self, reason: str) -> None:
        """Ended before its end: the ids sampled so far join as ``reason`` (TOK-43)."""
        if not self._joined:
            self._joined = True
            self._trajectory.cut_short(self.ids, self.logprobs, reason)


def _schemas(tools: Toolset) -> ToolSchemas:
    """Each function tool's ``parameters`` schema by name (qwen3_coder types values by it)."""
    return {t.name: t.parameters for t in tools.callables if t.parameters is not None}
