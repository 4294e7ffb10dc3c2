"""Requests about a context that run no rollout: ``POST /v1/responses/compact`` (COMPACT-1) and
``POST /v1/responses/input_tokens`` (TOKENS-1).

Both prepare the context exactly as a create does on its full path (header, stored history,
``item_reference`` resolution, validation, safety policy, rendering, COMPACT-4 pruning), so the
count is the prompt a create with the same body would sample from, and the compaction starts
from the same context.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from engine.connection.loader import load_conversation
from engine.conversation.compaction import prune, take_trigger
from engine.conversation.context import Context
from engine.conversation.pipeline import FULL, Pipeline, StageStats, rebuilt
from engine.conversation.requests import check_supported
from engine.core import Engine
from engine.models.base import HOSTED_TOOLS, Backend, BackendError
from engine.models.compaction import CompactRequest, compact
from engine.store import listing_form
from protocol.errors import InvalidRequest, ServerError
from protocol.response import (
    CompactedResponse,
    CompactParams,
    CreateParams,
    InputTokenCount,
    Usage,
)
from protocol.stream import new_id

log = logging.getLogger("rollout.context_api")


@dataclass(frozen=True)
class Prepared:
    ctx: Context
    backend: Backend
    model: str


async def prepare(engine: Engine, params: CreateParams, *, owner: str | None) -> Prepared:
    """The context a create of ``owner`` with these parameters would sample from first; the
    stored conversation comes from the one loader, with its owner check (OWN-4)."""
    if params.conversation is not None:  # CONV-5: creates only
        raise InvalidRequest(
            "unsupported_parameter",
            "conversation is not supported here; use previous_response_id.",
            "conversation",
        )
    items, texts = check_supported(
        params, "http", engine.config.max_input_items, engine.config.max_input_chars
    )
    items, texts, _ = take_trigger(items, texts)  # never context (COMPACT-7)
    model = params.model or engine.config.default_model
    backend = engine.router.resolve(model)
    found = await load_conversation(
        engine, params.previous_response_id, owner=owner, backend=backend
    )
    history = found.stored.items if found.stored is not None else []
    stats = StageStats()
    pipeline = Pipeline(stats, engine.config.safety_policy)
    pipeline.seal_keys(engine.reasoning_keys, owner)  # opened as a create opens it (SEAL-7)
    ctx = Context()
    runs_hosted = HOSTED_TOOLS in backend.supports
    pipeline.render_header(
        ctx, params.instructions, params.toolset, params.tool_choice, runs_hosted
    )
    if history:
        pipeline.apply(ctx, history, path=FULL, supports=backend.supports, param="history")
    pipeline.apply(ctx, items, path=FULL, supports=backend.supports, texts=texts)
    pruned = prune(ctx.items)
    if pruned is not None:
        ctx = rebuilt(pipeline, ctx, pruned, backend.supports)
    engine.stats.add(stats)
    return Prepared(ctx, backend, model)


async def count_input_tokens(
    engine: Engine, params: CreateParams, *, owner: str | None
) -> InputTokenCount:
    """TOKENS-1: the prompt tokens of the create these parameters describe."""
    prepared = await prepare(engine, params, owner=owner)
    return InputTokenCount(input_tokens=prepared.ctx.prompt_tokens)


async def compact_context(
    engine: Engine, params: CompactParams, *, owner: str | None
) -> CompactedResponse:
    """COMPACT-1: the compacted window of the input and/or the stored conversation."""
    create = CreateParams(
        model=params.model,
        input=params.input if params.input is not None else [],
        instructions=params.instructions,
        previous_response_id=params.previous_response_id,
    )
    prepared = await prepare(engine, create, owner=owner)
    try:
        result = await compact(prepared.backend, CompactRequest(prepared.model, prepared.ctx))
    except BackendError as exc:
        # An upstream's refusal keeps its status (MODEL-5); any other fault is generic (ERR-3).
        log.warning("compaction with %s failed: %s", prepared.model, exc)
        raise exc.protocol_error() or ServerError(
            message="The model failed to compact the context."
        ) from None
    engine.counters["compaction.endpoint"] += 1
    return CompactedResponse(
        id=new_id("resp"),
        created_at=int(time.time()),
        output=[listing_form(item) for item in result.items],
        usage=Usage(
            input_tokens=result.input_tokens,
            output_tokens=result.output_tokens,
            total_tokens=result.input_tokens + result.output_tokens,
        ),
    )
