"""The compatibility layer: standard ``response.create`` flows onto rollout coroutines.

Four ways a create can start (SPEC: COMPAT-1..COMPAT-6), cheapest first:

* fast path  - ``previous_response_id`` names the response at which a live rollout on this lane
               is suspended and the input answers its pending calls: resume that coroutine. Only
               the new items are validated, scanned and rendered.
* cache path - it names the lane's cached latest response: a new rollout seeded from the cached
               context (items and rendered tokens, copied once); only new items are processed.
* parked     - it names the last response of a rollout parked by a closed socket of the same
               owner: the new connection adopts that coroutine and resumes it (PARK-3).
* hydrated   - a recent ``store=true`` response of this process (HYD-1): fork its cached context,
               only new items are processed.
* store path - a ``store=true`` response in no cache: hydrate from the store, full pipeline.
* stateless  - no ``previous_response_id``: full pipeline over the whole input.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from engine.compaction import compaction_threshold
from engine.context import Context
from engine.core import Engine
from engine.lane import CacheEntry, Lane
from engine.models.base import Backend
from engine.models.trajectory import Trajectory
from engine.parking import Parked
from engine.pipeline import FULL, INCREMENTAL, ItemTexts
from engine.rollout import Mode, Rollout, Settings, Sink, Turn
from engine.store import ResponseStore, StoreError
from engine.store.errors import wire_error
from protocol.codec import parse_input
from protocol.errors import InvalidRequest, previous_response_not_found, store_unavailable
from protocol.items import InputItem, item_texts
from protocol.response import CreateParams, Reasoning, Response
from protocol.stream import ResponseStream, new_id
from protocol.tools import echoed_tools


class Connection(Protocol):
    """What a create needs from the connection it arrived on (``engine.session.Session``).

    Declared here, so this module depends on no session type: the session calls in."""

    engine: Engine
    transport: str
    sink: Sink
    default_mode: Mode
    append_targets: dict[str, Rollout]
    finished_appends: deque[str]
    finished: deque[str]  # recent terminal ids (steer errors, STEER-7)
    on_admitted: Callable[[Turn, list[InputItem]], Awaitable[None]] | None  # background (BG-2)
    owner: str | None  # the API-key identity of the requester (OWN-1)

    def resolve(self, model: str) -> Backend: ...

    def cached(self, response_id: str) -> tuple[Lane, CacheEntry] | None: ...

    def spawn(self, rollout: Rollout) -> None: ...

    def adopt(self, task: asyncio.Task[None], rollout: Rollout) -> None: ...


def settings_from(params: CreateParams, model: str) -> Settings:
    return Settings(
        model=model,
        instructions=params.instructions,
        tools=params.toolset,
        tool_choice=params.tool_choice,
        parallel_tool_calls=params.parallel_tool_calls,
        max_output_tokens=params.max_output_tokens,
        store=params.store,
        temperature=params.temperature,
        top_p=params.top_p,
        compact_threshold=compaction_threshold(params.context_management),
        include_tokens="rollout.token_ids" in (params.include or ()),
    )


def new_response(params: CreateParams, model: str) -> Response:
    return Response(
        id=new_id("resp"),
        created_at=int(time.time()),
        background=params.background,
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
        presence_penalty=params.presence_penalty or 0.0,
        frequency_penalty=params.frequency_penalty or 0.0,
        truncation=params.truncation or "disabled",
        text=params.text or {"format": {"type": "text"}},
        tool_choice=params.tool_choice,
        tools=echoed_tools(params.toolset),
        metadata={str(k): str(v) for k, v in (params.metadata or {}).items()},
        user=params.user,
        safety_identifier=params.safety_identifier,
        prompt_cache_key=params.prompt_cache_key,
        service_tier=params.service_tier or "default",
    )


def check_supported(
    params: CreateParams, transport: str, max_items: int, max_chars: int = 8_000_000
) -> tuple[list[InputItem], ItemTexts]:
    """Reject what this server does not do, clearly (LEN-3), and parse the input. Returns the
    items and their readable texts (computed once: the size limit here, the safety scan later)."""
    if params.background and transport == "ws":
        raise InvalidRequest(
            "unsupported_parameter", "background is not supported over WebSocket.", "background"
        )
    if params.background and not params.store:
        raise InvalidRequest("invalid_value", "Background responses require store=true.", "store")
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
    check_metadata(params.metadata)
    items = parse_input(params.input)
    if len(items) > max_items:
        raise InvalidRequest(
            "too_many_items", f"At most {max_items} input items are accepted per request.", "input"
        )
    texts = [item_texts(item) for item in items]
    if sum(len(text) for readable in texts for text in readable) > max_chars:
        raise InvalidRequest(
            "input_too_large",
            f"The input text of one request may hold at most {max_chars:,} characters.",
            "input",
        )
    return items, texts


@dataclass
class Admission:
    """One accepted create: everything needed to start or resume its rollout."""

    params: CreateParams
    items: list[InputItem]
    texts: ItemTexts  # each item's readable texts
    backend: Backend
    mode: Mode
    turn: Turn
    settings: Settings

    @property
    def prev(self) -> str | None:
        return self.params.previous_response_id


MAX_METADATA_KEYS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512


def check_metadata(metadata: dict[str, Any] | None) -> None:
    """OpenAI's metadata rules: at most 16 string pairs, keys <= 64 and values <= 512 chars."""
    if not metadata:
        return
    if len(metadata) > MAX_METADATA_KEYS:
        raise InvalidRequest(
            "invalid_value", f"metadata holds at most {MAX_METADATA_KEYS} pairs.", "metadata"
        )
    for key, value in metadata.items():
        where = f"metadata.{key[:MAX_METADATA_KEY]}"
        if not isinstance(value, str):
            raise InvalidRequest("invalid_type", "Metadata values must be strings.", where)
        if len(key) > MAX_METADATA_KEY or len(value) > MAX_METADATA_VALUE:
            raise InvalidRequest(
                "invalid_value",
                f"Metadata keys hold at most {MAX_METADATA_KEY} characters and values "
                f"{MAX_METADATA_VALUE}.",
                where,
            )


async def run_create(
    session: Connection, lane: Lane, params: CreateParams, arrived: float | None = None
) -> None:
    """Run one create to its terminal frame. Raises ``ProtocolError`` for request-scoped errors
    (nothing was emitted for this request then)."""
    try:
        picked_up = time.perf_counter()
        job = _admit(session, lane, params)
        if arrived is not None:  # time spent waiting in the lane, not admitting (OBS-1)
            job.turn.log.add_time("queue", picked_up - arrived)
        rollout, started = await _start_or_resume(session, lane, job)
        if session.on_admitted is not None:
            await session.on_admitted(job.turn, rollout.ctx.items)
    except Exception:
        if params.previous_response_id is not None:
            # A failed continuation evicts its parent from this lane (CACHE-3); a failed fork
            # from another lane leaves that lane's cache alone (CACHE-4).
            lane.evict(params.previous_response_id)
        raise
    if not params.generate:
        await rollout.warm()
    elif started:
        session.spawn(rollout)
    turn = job.turn
    while True:  # a steered response hands the lane to its successor (STEER-3)
        status = await _serve_turn(session, job, rollout, turn)
        if turn.successor is None:
            break
        turn = turn.successor
    _after_turn(session.engine, lane, job, turn, rollout, status)


async def _serve_turn(session: Connection, job: Admission, rollout: Rollout, turn: Turn) -> str:
    """Wait for one response's terminal event; an append-mode response is a target meanwhile."""
    response_id = turn.stream.id
    if job.mode is Mode.APPEND:
        session.append_targets[response_id] = rollout
    try:
        return await turn.done
    finally:
        session.finished.append(response_id)
        if session.append_targets.pop(response_id, None) is not None:
            session.finished_appends.append(response_id)


def _admit(session: Connection, lane: Lane, params: CreateParams) -> Admission:
    engine = session.engine
    config = engine.config
    items, texts = check_supported(
        params, session.transport, config.max_input_items, config.max_input_chars
    )
    model = params.model or engine.config.default_model
    stream = ResponseStream(new_response(params, model), lane.name)
    turn = Turn(stream, session.sink, items)
    start = time.perf_counter()
    backend = session.resolve(model)
    turn.log.add_time("route", time.perf_counter() - start)
    return Admission(
        params=params,
        items=items,
        texts=texts,
        backend=backend,
        mode=Mode(params.rollout_mode or session.default_mode.value),
        turn=turn,
        settings=settings_from(params, model),
    )


async def _start_or_resume(session: Connection, lane: Lane, job: Admission) -> tuple[Rollout, bool]:
    """Returns the rollout serving this create and whether it is new (needs a task).

    A warmup (``generate: false``) never takes the fast path: it does not sample."""
    engine = session.engine
    counters = engine.counters
    prev = job.prev
    if job.settings.store:
        await _require_store(session.engine.store)
    if prev is None:
        counters["create.stateless"] += 1
        return _new_rollout(session, job, None, FULL), True
    found = session.cached(prev)
    if found is not None and found[0] is lane:
        entry = found[1]
        live = entry.resumable_by(job.backend, job.mode) if job.params.generate else None
        if live is not None:
            counters["create.fast_path"] += 1
            engine.hydrated.discard(prev)  # the shared context moves on (HYD-3)
            live.continue_standard(job.items, job.texts, job.turn, job.settings)
            lane.latest = None  # its context now moves on; the new response replaces it
            return live, False
        counters["create.cache_hit"] += 1
        ctx = entry.ctx.fork()
        if entry.rollout is not None:
            entry.rollout.retire()
            entry.rollout = None
        return _new_rollout(session, job, ctx, INCREMENTAL), True
    if found is not None:  # a fork from another lane: copy its context, leave it running
        counters["create.fork"] += 1
        return _new_rollout(session, job, found[1].ctx.fork(), INCREMENTAL), True
    parked = engine.parking.claim(prev, session.owner)
    if parked is not None:
        assert isinstance(parked.rollout, Rollout)  # the only kind the session parks
        if parked.rollout.settings.store and not await _still_stored(engine, prev):
            session.adopt(parked.task, parked.rollout)  # owned while it winds down
            parked.rollout.retire()
            raise previous_response_not_found(prev)
        return _unpark(session, job, parked, parked.rollout)
    cached = engine.hydrated.get(prev, session.owner, job.backend.supports)
    if cached is not None and await _still_stored(engine, prev):
        counters["create.hydrated"] += 1
        return _new_rollout(session, job, cached.ctx.fork(), INCREMENTAL), True
    counters["create.cache_miss"] += 1
    start = time.perf_counter()
    try:
        hydrated = await session.engine.store.hydrate(prev)
        job.turn.log.add_time("hydrate", time.perf_counter() - start)  # OBS-1
    except StoreError as exc:
        raise wire_error(exc, "previous_response_id") from None
    if hydrated is None or hydrated.record.owner != session.owner:  # another key's (OWN-2)
        raise previous_response_not_found(prev)
    if hydrated.record.response.status in ("queued", "in_progress"):  # background (BG-7)
        raise InvalidRequest(
            "previous_response_in_progress",
            f"Previous response with id '{prev}' has not finished yet.",
            "previous_response_id",
        )
    counters["create.store_hydrate"] += 1
    # The stored token trajectory, if any, continues as it was sampled (TOK-8).
    tokens = Trajectory.from_segments(hydrated.tokens) if hydrated.tokens else None
    ctx = Context(model_tokens=tokens)
    rollout = Rollout(session.engine, job.backend, job.settings, job.turn, job.mode, ctx)
    rollout.owner = session.owner
    rollout.prepare(job.items, job.texts, path=FULL, history=hydrated.items, stored=hydrated.point)
    return rollout, True


# Backends whose deletes reach this process's caches: this process's own memory, and Redis,
# which publishes every delete to all processes (STORE-11).
_DELETES_REACH_US = frozenset({"memory", "redis"})


async def _still_stored(engine: Engine, response_id: str) -> bool:
    """A cached context of a stored response is served only while the response exists (HYD-5).
    Where a delete by another process cannot reach this one (SQLite shared by workers), the
    hit is confirmed with one read; otherwise the delete listener has already dropped it."""
    store = engine.store
    if store.kind in _DELETES_REACH_US:
        return True
    try:
        found = await store.exists(response_id)
    except StoreError as exc:
        raise wire_error(exc, "previous_response_id") from None
    if not found:
        engine.hydrated.discard(response_id)
    return found


async def _require_store(store: ResponseStore) -> None:
    """A ``store: true`` create is refused up front while the store is known to be down, so no
    model time is spent on a response that could not be kept; each such request probes the
    store again, so service resumes by itself (STORE-8)."""
    if not store.available and not await store.health():
        raise store_unavailable()


def _unpark(
    session: Connection, job: Admission, parked: Parked, rollout: Rollout
) -> tuple[Rollout, bool]:
    """A parked rollout's owner is back (PARK-3): resume it on the fast path when the request
    allows (COMPAT-2), else fork its context and retire it (COMPAT-3). Either way the session
    now owns its task; a rejected continuation retires it (CACHE-3)."""
    engine = session.engine
    session.adopt(parked.task, rollout)
    entry = CacheEntry(parked.response_id, rollout.ctx, rollout.backend, rollout)
    live = entry.resumable_by(job.backend, job.mode) if job.params.generate else None
    if live is None:
        engine.counters["create.cache_hit"] += 1
        ctx = rollout.ctx.fork()
        rollout.retire()
        return _new_rollout(session, job, ctx, INCREMENTAL), True
    engine.counters["create.fast_path"] += 1
    engine.counters["create.unparked"] += 1
    engine.hydrated.discard(parked.response_id)  # the shared context moves on (HYD-3)
    try:
        live.continue_standard(job.items, job.texts, job.turn, job.settings)
    except Exception:
        live.retire()
        raise
    return live, False


def _new_rollout(session: Connection, job: Admission, ctx: Context | None, path: str) -> Rollout:
    rollout = Rollout(session.engine, job.backend, job.settings, job.turn, job.mode, context=ctx)
    rollout.owner = session.owner  # what it stores and parks belongs to the requester (OWN-1)
    rollout.prepare(job.items, job.texts, path=path)
    return rollout


def _after_turn(
    engine: Engine, lane: Lane, job: Admission, turn: Turn, rollout: Rollout, status: str
) -> None:
    """Update the lane cache after a response's terminal frame (CACHE-1..CACHE-3), and publish a
    stored response's context to the process's hydration cache (HYD-1). After steering,
    ``turn`` is the last successor: it is the lane's latest."""
    if status in ("completed", "incomplete"):
        live = rollout if rollout.waiting else None
        lane.replace(CacheEntry(turn.stream.id, rollout.ctx, job.backend, live))
        if job.settings.store:
            engine.hydrated.publish(turn.stream.id, rollout.ctx, job.backend, rollout.owner)
    elif job.prev is not None and turn is job.turn:
        lane.evict(job.prev)
