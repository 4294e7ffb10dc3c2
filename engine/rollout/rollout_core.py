"""What a rollout is, apart from its coroutine (SPEC: ROLL-1, PIPE-1, VAL-5, COMPACT-4).

A ``RolloutCore`` holds what a rollout works with: its identity, the backend and settings, the
response being produced (``turn``), its lifecycle state (``state.py``), its context and the
pre-inference that feeds it (``prepare``, ``replace_context``), its books (``accounting.py``),
its steering queue and hosted tools. The endings (``endings.py``) and a sampling step
(``sampling.py``) work with this; ``coroutine.Rollout`` adds the loop, the Future it suspends
on and the sessions' verbs. So the steps never import the coroutine and need no mirror of it.
"""

from __future__ import annotations

import asyncio
import time

from engine.conversation.compaction import prune
from engine.conversation.context import Context
from engine.conversation.pipeline import FULL, ItemTexts, Pipeline, rebuilt
from engine.conversation.validation import resolve_references, validate
from engine.core import Engine
from engine.models.base import HOSTED_TOOLS, Backend
from engine.rollout.accounting import Accounting
from engine.rollout.deadline import Deadline
from engine.rollout.hosted import HostedTools, approval_answers, replayed
from engine.rollout.state import RolloutState, RolloutStep, advance
from engine.rollout.steering import Steering
from engine.rollout.turn import Mode, Settings, Turn
from engine.store import ChainPoint
from protocol.errors import InvalidRequest
from protocol.items import InputItem, ToolCall, ToolOutput
from protocol.states import ResponseState
from protocol.stream import new_id


class RolloutCore:
    def __init__(
        self,
        engine: Engine,
        backend: Backend,
        settings: Settings,
        turn: Turn,
        mode: Mode,
        context: Context | None = None,
    ) -> None:
        self.id = new_id("rollout")
        self.engine = engine
        self.backend = backend
        self.settings = settings
        self.turn = turn
        self.mode = mode
        self.ctx = context if context is not None else Context()
        self.accounting = Accounting(self.id, mode, engine.bench_clock)
        estimate = backend.renders_own_tokens or backend.reports_usage  # TOK-10, UP-8
        self.pipeline = Pipeline(self.accounting.stats, engine.config.safety_policy, estimate)
        self.pipeline.log = turn.log
        self.state = RolloutState.RUNNING
        self.response_ids: list[str] = [turn.stream.id]
        self.steering = Steering()
        self.owner: str | None = None  # the API key fingerprint its stored records carry
        self.started_at = time.time()  # for the inspector (INSP-4)
        self.loop = asyncio.get_running_loop()  # held: each lookup is a system call (3.11)
        self.model_deadline = Deadline(self.loop)  # each step's model_timeout_s (sampling.py)
        self.hosted = HostedTools(engine.mcp_limits, engine.config.mcp_max_calls)  # MCP-12

    def advance(self, step: RolloutStep) -> None:
        """The one way its state changes: by the table (``state.py``)."""
        self.state = advance(self.state, step)

    async def open_turn(self, turn: Turn) -> None:
        if turn.stream.state is ResponseState.NEW:
            await turn.sink.send(turn.stream.created())
            await turn.sink.send(turn.stream.in_progress())

    # ================================================================== pre-inference
    def prepare(
        self,
        items: list[InputItem],
        texts: ItemTexts | None = None,
        *,
        path: str,
        history: list[InputItem] | None = None,
        stored: ChainPoint | None = None,
    ) -> None:
        """Pre-inference over the request's input: full history or only what is new (PIPE-1).

        ``history`` (a stored conversation) is processed first, so error ``param`` paths still
        index the request's own ``input``."""
        self.accounting.rendered(self._render_header(self.settings))
        if history:
            self._apply(history, path, param="history")
            if stored is not None and len(self.ctx.items) == stored.length:
                self.ctx.stored = stored  # the next stored turn writes only what follows
        self._apply(items, path, texts=texts)
        if path == FULL:
            pruned = prune(self.ctx.items)  # a compaction item stands for what came before it
            if pruned is not None:  # (COMPACT-4), after validation: params index the input
                self.replace_context(pruned)
        missing = unanswered(self.ctx, items)
        if missing:
            raise missing_output(missing[0].call_id)
        if self.ctx.carried:  # ids the input carried back on its items (TOK-62, TOK-63)
            self.backend.continue_carried(self.ctx, self.settings.tools)
        self.accounting.ready()

    def _apply(
        self,
        items: list[InputItem],
        path: str,
        param: str = "input",
        texts: ItemTexts | None = None,
    ) -> int:
        """Pre-inference over ``items`` onto the context; what it renders counts as fresh."""
        items, texts = self._admitted(items, texts)
        rendered = self.pipeline.apply(
            self.ctx, items, path=path, supports=self.backend.supports, param=param, texts=texts
        )
        self.accounting.rendered(rendered)
        return rendered

    def _admitted(
        self, items: list[InputItem], texts: ItemTexts | None
    ) -> tuple[list[InputItem], ItemTexts | None]:
        """What pre-inference sees of new items: sealed reasoning opened with this owner's keys
        (SEAL-2, SEAL-4), MCP items as the context holds them (MCP-15)."""
        self.pipeline.seal_keys(self.engine.reasoning_keys, self.owner)
        return self.hosted.accept(items, texts)

    def _render_header(self, s: Settings) -> int:
        """Instructions and tools; a forced hosted tool needs a backend that runs it (TOOL-5)."""
        runs_hosted = HOSTED_TOOLS in self.backend.supports
        return self.pipeline.render_header(
            self.ctx, s.instructions, s.tools, s.tool_choice, runs_hosted
        )

    def replace_context(self, items: list[InputItem]) -> None:
        """A fresh context holding ``items`` (a compacted window); nothing in it is cached."""
        self.ctx = rebuilt(self.pipeline, self.ctx, items, self.backend.supports)
        self.accounting.rerendered(self.ctx.prompt_tokens)


def require_answers(ctx: Context, items: list[InputItem], supports: frozenset[str]) -> None:
    """Every function call must be answered before the model samples again (VAL-5); an
    ``mcp_approval_response`` answers its approval request (MCP-9). Checked before anything
    is committed, yet the input's own faults (ITEM-4, VAL-1..VAL-3, MCP-18) come first, as
    on every other path (VAL-5): a resumed rollout answers as a new one would (PARK-4)."""
    answered = {i.call_id for i in items if isinstance(i, ToolOutput)}
    answered.update(approval_answers(items))
    for call in ctx.pending_calls():
        if call.call_id not in answered:
            seen, _ = replayed(items, None)  # as pre-inference sees them (MCP-16)
            validate(ctx, resolve_references(ctx, seen, "input"), supports)
            raise missing_output(call.call_id)


def unanswered(ctx: Context, items: list[InputItem]) -> list[ToolCall]:
    """The context's pending calls that neither an output nor, for an MCP approval request,
    an ``mcp_approval_response`` among ``items`` answers (MCP-9)."""
    approved = approval_answers(items)
    return [call for call in ctx.pending_calls() if call.call_id not in approved]


def missing_output(call_id: str) -> InvalidRequest:
    return InvalidRequest(
        "tool_output_missing", f"No tool output found for function call {call_id}.", "input"
    )
