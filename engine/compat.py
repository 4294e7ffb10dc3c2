"""The compatibility layer: standard ``response.create`` flows onto rollout coroutines.

Four ways a create can start (SPEC: COMPAT-1..COMPAT-6), cheapest first:

* fast path  - ``previous_response_id`` names the response at which a live rollout on this lane
               is suspended and the input answers its pending calls: resume that coroutine. Only
               the new items are validated, scanned and rendered.
* cache path - it names the lane's cached latest response: a new rollout seeded from the cached
               context (items and rendered tokens, copied once); only new items are processed.
* store path - a ``store=true`` response not in the cache: hydrate from the store, full pipeline.
* stateless  - no ``previous_response_id``: full pipeline over the whole input.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.models.base import Backend
from engine.pipeline import FULL, INCREMENTAL, Context
from engine.rollout import Mode, Rollout, Settings, Turn
from protocol.codec import parse_input
from protocol.errors import InvalidRequest, previous_response_not_found
from protocol.items import InputItem
from protocol.response import CreateParams, Reasoning, Response
from protocol.stream import ResponseStream, new_id

if TYPE_CHECKING:
    from engine.session import Lane, Session


@dataclass
class CacheEntry:
    """A lane's latest response: what a continuation needs without touching the store."""

    response_id: str
    ctx: Context
    backend: Backend
    rollout: Rollout | None  # set while that rollout is suspended at this response

    def resumable_by(self, backend: Backend, mode: Mode) -> Rollout | None:
        rollout = self.rollout
        if rollout is None or not rollout.waiting or rollout.mode is not Mode.STANDARD:
            return None
        if mode is not Mode.STANDARD or rollout.backend is not backend:
            return None
        return rollout


def settings_from(params: CreateParams, model: str) -> Settings:
    return Settings(
        model=model,
        instructions=params.instructions,
        tools=params.tools,
        tool_choice=params.tool_choice,
        parallel_tool_calls=params.parallel_tool_calls,
        max_output_tokens=params.max_output_tokens,
        max_tool_calls=params.max_tool_calls,
        store=params.store,
    )


def new_response(params: CreateParams, model: str) -> Response:
    return Response(
        id=new_id("resp"),
        created_at=int(time.time()),
        model=model,
        instructions=params.instructions,
        max_output_tokens=params.max_output_tokens,
        max_tool_calls=params.max_tool_calls,
        parallel_tool_calls=params.parallel_tool_calls,
        previous_response_id=params.previous_response_id,
        reasoning=params.reasoning or Reasoning(),
        store=params.store,
        temperature=1.0 if params.temperature is None else params.temperature,
        top_p=1.0 if params.top_p is None else params.top_p,
        top_logprobs=params.top_logprobs or 0,
        truncation=params.truncation or "disabled",
        text=params.text or {"format": {"type": "text"}},
        tool_choice=params.tool_choice,
        tools=params.tools,
        metadata=params.metadata or {},
        user=params.user,
        safety_identifier=params.safety_identifier,
        prompt_cache_key=params.prompt_cache_key,
        service_tier=params.service_tier or "default",
    )


def check_supported(params: CreateParams, transport: str, max_items: int) -> list[InputItem]:
    """Reject what this server does not do, clearly (LEN-3), and parse the input."""
    if params.background:
        raise InvalidRequest(
            "unsupported_parameter", "Background responses are not supported.", "background"
        )
    if params.conversation is not None:
        raise InvalidRequest(
            "unsupported_parameter",
            "Conversations are not supported; use previous_response_id.",
            "conversation",
        )
    if params.previous_response_id is not None and not params.previous_response_id:
        raise InvalidRequest(
            "invalid_value", "previous_response_id must be non-empty.", "previous_response_id"
        )
    if transport != "ws" and params.rollout_mode == "append":
        raise InvalidRequest(
            "unsupported_parameter",
            "The append rollout mode is only available over WebSocket.",
            "rollout_mode",
        )
    items = parse_input(params.input)
    if len(items) > max_items:
        raise InvalidRequest(
            "too_many_items", f"At most {max_items} input items are accepted per request.", "input"
        )
    return items


async def run_create(session: Session, lane: Lane, params: CreateParams) -> None:
    """Run one create to its terminal frame. Raises ``ProtocolError`` for request-scoped errors
    (nothing was emitted for this request then)."""
    engine = session.engine
    items = check_supported(params, session.transport, engine.config.max_input_items)
    mode = Mode(params.rollout_mode or session.default_mode.value)
    model = params.model or engine.config.default_model
    backend = session.resolve(model)
    response = new_response(params, model)
    turn = Turn(ResponseStream(response, lane.name), session.sink, items)
    settings = settings_from(params, model)
    prev = params.previous_response_id
    try:
        rollout, started = _start_or_resume(
            session, lane, prev, backend, mode, items, turn, settings
        )
    except Exception:
        if prev is not None:
            lane.evict(prev)  # a failed continuation evicts its parent (CACHE-3)
        raise
    if not params.generate:
        await rollout.warm()
    elif started:
        session.spawn(rollout)
    if mode is Mode.APPEND:
        session.append_targets[response.id] = rollout
    try:
        status = await turn.done
    finally:
        if session.append_targets.pop(response.id, None) is not None:
            session.finished_appends.append(response.id)
    _after_turn(lane, prev, rollout, backend, response.id, status)


def _start_or_resume(
    session: Session,
    lane: Lane,
    prev: str | None,
    backend: Backend,
    mode: Mode,
    items: list[InputItem],
    turn: Turn,
    settings: Settings,
) -> tuple[Rollout, bool]:
    """Returns the rollout serving this create and whether it is new (needs a task)."""
    engine = session.engine
    counters = engine.counters
    if prev is None:
        counters["create.stateless"] += 1
        return _new_rollout(session, backend, settings, turn, mode, None, items, FULL), True
    entry = lane.latest if lane.latest is not None and lane.latest.response_id == prev else None
    if entry is not None:
        live = entry.resumable_by(backend, mode)
        if live is not None:
            counters["create.fast_path"] += 1
            live.continue_standard(items, turn, settings)
            return live, False
        counters["create.cache_hit"] += 1
        ctx = entry.ctx.fork()
        if entry.rollout is not None:
            entry.rollout.retire()
            entry.rollout = None
        return _new_rollout(session, backend, settings, turn, mode, ctx, items, INCREMENTAL), True
    counters["create.cache_miss"] += 1
    record = engine.responses.get(prev)
    if record is None:
        raise previous_response_not_found(prev)
    counters["create.store_hydrate"] += 1
    history = record.context + items
    return _new_rollout(session, backend, settings, turn, mode, None, history, FULL), True


def _new_rollout(
    session: Session,
    backend: Backend,
    settings: Settings,
    turn: Turn,
    mode: Mode,
    ctx: Context | None,
    items: list[InputItem],
    path: str,
) -> Rollout:
    rollout = Rollout(session.engine, backend, settings, turn, mode, context=ctx)
    rollout.prepare(items, path=path)
    return rollout


def _after_turn(
    lane: Lane,
    prev: str | None,
    rollout: Rollout,
    backend: Backend,
    response_id: str,
    status: str,
) -> None:
    """Update the lane cache after a response's terminal frame (CACHE-1..CACHE-3)."""
    if status in ("completed", "incomplete"):
        live = rollout if rollout.waiting else None
        lane.replace(CacheEntry(response_id, rollout.ctx, backend, live))
    elif prev is not None:
        lane.evict(prev)
