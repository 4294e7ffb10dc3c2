"""The compatibility layer: standard ``response.create`` flows onto rollout coroutines.

Pick the path, then run it. The ways a create starts (SPEC: COMPAT-1..COMPAT-6, PARK-3, HYD-1,
PARK-21, CONV-5) are named once, cheapest first, in ``connection/loader.py``'s ``PATHS`` table
(one row per ``LoadPath``). The loader (OWN-4) picks the path and its source,
owner-checked; ``_RUNS`` here maps each path to the function that starts or resumes the rollout,
and ``_after_turn`` updates the lane cache through the lane's methods (CACHE-1..CACHE-3).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from engine.connection.connection import Connection
from engine.connection.lane import CacheEntry, Lane
from engine.connection.loader import Create, Found, LoadPath, load_conversation, load_joined
from engine.conversation.compaction import compaction_threshold, take_trigger
from engine.conversation.context import Context
from engine.conversation.pipeline import FULL, INCREMENTAL, ItemTexts
from engine.conversation.requests import check_supported, conversation_id
from engine.conversation.resend import Sent, sent
from engine.conversation.sealed import INCLUDE as SEAL_INCLUDE
from engine.conversation.trajectory import Trajectory
from engine.core import Engine
from engine.models.base import TRAINING_INCLUDE, Backend
from engine.rollout.coroutine import Rollout
from engine.rollout.turn import MODES, Mode, Settings, Turn
from engine.store import ResponseStore
from engine.store.conversations import Joined
from protocol.errors import ProtocolError, store_unavailable
from protocol.items import InputItem, carries_tokens, item_texts
from protocol.response import ConversationRef, CreateParams, ReasoningConfig, Response
from protocol.stream import ResponseStream, new_id
from protocol.tools import echoed_tools


def settings_from(params: CreateParams, model: str, *, compact_now: bool = False) -> Settings:
    return Settings(
        compact_now=compact_now,
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
        training_fields=TRAINING_INCLUDE in (params.include or ()),
        seal_reasoning=SEAL_INCLUDE in (params.include or ()),
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
        reasoning=params.reasoning or ReasoningConfig(),
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

    head: str | None = None  # a conversation's stored response it continues from (CONV-6)
    held: int = 0  # its first items, an earlier create's, byte for byte: not decoded (COMPAT-7)
    sent: Sent | None = None  # its raw input and what it decoded to, remembered (COMPAT-7)

    @property
    def prev(self) -> str | None:
        return self.params.previous_response_id or self.head


async def run_create(
    session: Connection, lane: Lane, params: CreateParams, arrived: float | None = None
) -> None:
    """Run one create to its terminal frame. Raises ``ProtocolError`` for request-scoped errors
    (nothing was emitted for this request then).

    Every create of every transport passes here, so its key's rate limits are checked here,
    once, before any other work (RATE-4); its tokens count when it ends."""
    quota = session.quota
    if quota is None:
        await _run_create(session, lane, params, arrived)
        return
    lease = await quota.admit()  # raises RateLimitExceeded (RATE-5)
    turns: list[Turn] = []
    try:
        await _run_create(session, lane, params, arrived, turns)
    finally:
        await quota.settle(lease, sum(_tokens(turn) for turn in turns))


def _tokens(turn: Turn) -> int:
    usage = turn.stream.response.usage
    return usage.total_tokens if usage is not None else 0


async def _run_create(
    session: Connection,
    lane: Lane,
    params: CreateParams,
    arrived: float | None,
    turns: list[Turn] | None = None,
) -> None:
    picked_up = time.perf_counter()
    job: Admission | None = None
    try:
        try:
            job = _admit(session, lane, params)
            if session.engine.tracing is not None:  # off: no span is made (OTEL-6)
                _trace(session, job)
            if arrived is not None:  # time spent waiting in the lane, not admitting (OBS-1)
                job.turn.log.add_time("queue", picked_up - arrived)
            rollout, started = await _start_or_resume(session, lane, job)
            if session.on_admitted is not None:
                await session.on_admitted(job.turn, rollout.ctx.items)
        except Exception:
            if params.previous_response_id is not None:
                # A failed continuation evicts its parent from this lane (CACHE-3); a failed
                # fork from another lane leaves that lane's cache alone (CACHE-4).
                lane.evict(params.previous_response_id)
            raise
        if not params.generate:
            await rollout.endings.warm()
        elif started:
            session.spawn(rollout)
        turn = job.turn
        while True:  # a steered response hands the lane to its successor (STEER-3)
            if turns is not None:
                turns.append(turn)  # its tokens count against the key's limits (RATE-2)
            status = await _serve_turn(session, job, rollout, turn)
            if turn.successor is None:
                break
            turn = turn.successor
    finally:
        if job is not None:  # its conversation, if a response still holds it (CONV-7)
            await _let_go(job.turn)
    _after_turn(session.engine, lane, job, turn, rollout, status)
    session.retain(lane)  # before the request ends: the chain's next create resumes it (PARK-4)


async def _let_go(turn: Turn | None) -> None:
    """A conversation a response never reached its end with is released all the same (CONV-7):
    a refused create, a cancel, a client gone, a write that failed; steered successors
    included (STEER-3)."""
    while turn is not None:
        joined, turn.conversation = turn.conversation, None
        if joined is not None:
            await joined.opened.lock.release()
        turn = turn.successor


async def _serve_turn(session: Connection, job: Admission, rollout: Rollout, turn: Turn) -> str:
    """Wait for one response's terminal event; an append-mode response is a target meanwhile."""
    response_id = turn.stream.id
    session.targets.serving(response_id, rollout if job.mode is Mode.APPEND else None)
    try:
        return await turn.done
    finally:
        session.targets.served(response_id)
        if turn.trace is not None:
            turn.trace.finish(_ended(turn, rollout))


def _trace(session: Connection, job: Admission) -> None:
    """The response's span (OTEL-2), a child of the client's ``traceparent``; its stages are
    marked on the turn log from now on (OTEL-3)."""
    assert session.engine.tracing is not None
    turn, params = job.turn, job.params
    attributes = {
        "rollout.response_id": turn.stream.id,
        "rollout.transport": session.transport,
        "rollout.mode": job.mode.value,
        "gen_ai.request.model": job.settings.model,
    }
    if params.previous_response_id is not None:
        attributes["rollout.previous_response_id"] = params.previous_response_id
    turn.trace = session.engine.tracing.start_turn(session.traceparent, attributes)
    turn.log.marks = turn.trace.marks


def _ended(turn: Turn, rollout: Rollout) -> dict[str, str | int]:
    """What the response's span says of its end: ids, status and token counts, no content."""
    usage = turn.stream.response.usage
    ended: dict[str, str | int] = {"rollout.id": rollout.id, "rollout.status": turn.status}
    if usage is not None:
        ended["gen_ai.usage.input_tokens"] = usage.input_tokens
        ended["gen_ai.usage.output_tokens"] = usage.output_tokens
    return ended


def _admit(session: Connection, lane: Lane, params: CreateParams) -> Admission:
    engine = session.engine
    config = engine.config
    raws = _raw_resend(engine, params)
    held = engine.hydrated.held(session.owner, raws) if raws else None
    items, texts = check_supported(
        params, session.transport, config.max_input_items, config.max_input_chars, held
    )
    items, texts, compact_now = take_trigger(items, texts)  # COMPACT-7
    known = held.length if held is not None else 0
    remembered = None
    if raws is not None and not compact_now and not any(map(carries_tokens, items[known:])):
        remembered = sent(raws, items, texts, held)  # for the next resend (COMPAT-7)
    model = params.model or engine.config.default_model
    stream = ResponseStream(new_response(params, model), lane.name, config.full_echo)
    turn = Turn(stream, session.sink, items, done=session.loop.create_future())
    start = time.perf_counter()
    backend = session.resolve(model)
    turn.log.add_time("route", time.perf_counter() - start)
    settings = settings_from(params, model, compact_now=compact_now)
    settings.training_fields |= backend.training_fields  # the route's setting (TOK-61)
    return Admission(
        params=params,
        items=items,
        texts=texts,
        backend=backend,
        mode=MODES[params.rollout_mode] if params.rollout_mode else session.default_mode,
        turn=turn,
        settings=settings,
        held=known,
        sent=remembered,
    )


def _raw_resend(engine: Engine, params: CreateParams) -> list[msgspec.Raw] | None:
    """An HTTP create's raw input items, when it may be a resend (COMPAT-7) and resends are
    on (the hydration cache is, HYD-2): what its first items may be looked up by."""
    raws = params.input
    if (
        raws
        and not isinstance(raws, str)
        and raws[0].__class__ is msgspec.Raw
        and params.previous_response_id is None
        and params.conversation is None
        and engine.hydrated.max_bytes
    ):
        return raws
    return None


Started = tuple[Rollout, bool]  # the rollout serving a create, and whether it needs a task


async def _start_or_resume(session: Connection, lane: Lane, job: Admission) -> Started:
    """Pick the path (the one loader, ``connection/loader.py``), then run it. Returns the
    rollout serving this create and whether it is new (needs a task)."""
    engine = session.engine
    if job.settings.store:
        await _require_store(engine.store)
    conversation = conversation_id(job.params)
    resend = job.items if conversation is None else None  # a resent history? (COMPAT-7)
    header = (job.settings.instructions, job.settings.tools)  # equal lists: this one's first
    create = Create(
        lane, session.cached, job.mode, job.params.generate, job.turn.log, resend, job.held, header
    )
    if conversation is None:
        found = await load_conversation(
            engine, job.prev, owner=session.owner, backend=job.backend, create=create
        )
    else:
        found = await load_joined(
            engine, conversation, owner=session.owner, backend=job.backend, create=create
        )
        _join(job, conversation, found)
    if found.path is LoadPath.STORE and (job.prev is not None or found.resent):
        assert found.stored is not None  # a copy parked on another node retires (PARK-9)
        await engine.announce_continued(found.stored.record.id)
    return _RUNS[found.path](session, lane, job, found)


def _join(job: Admission, conversation: str, found: Found) -> None:
    """A create on a conversation (CONV-5, CONV-6): it continues from the conversation's stored
    response (``head``), with the conversation's items that response does not hold before its
    own input; its response names the conversation, and appends to it when it ends."""
    assert found.opened is not None
    turn = job.turn
    turn.conversation = Joined(found.opened.lock.conversations, found.opened, turn.input_items)
    turn.stream.response.conversation = ConversationRef(conversation)
    if found.path is not LoadPath.CONVERSATION:
        job.head = found.opened.head.response_id
    if found.pending:
        job.items = [*found.pending, *job.items]
        job.texts = [*(item_texts(item) for item in found.pending), *job.texts]


def _run_fast(session: Connection, lane: Lane, job: Admission, found: Found) -> Started:
    """COMPAT-2: resume the rollout suspended at the lane's latest response."""
    assert found.live is not None and job.prev is not None
    engine = session.engine
    engine.counters["create.fast_path"] += 1
    engine.hydrated.discard(job.prev)  # the shared context moves on (HYD-3)
    found.live.continue_standard(job.items, job.texts, job.turn, job.settings)
    lane.consume()  # its context now moves on; the new response replaces it
    return found.live, False


def _run_cache(session: Connection, lane: Lane, job: Admission, found: Found) -> Started:
    """COMPAT-3 on the create's own lane (its suspended rollout is retired), CACHE-4 from
    another lane (a fork: that lane's rollout keeps running)."""
    entry = found.entry
    assert entry is not None
    if found.lane is not lane:
        session.engine.counters["create.fork"] += 1
        return _new_rollout(session, job, entry.ctx.fork(), INCREMENTAL), True
    session.engine.counters["create.cache_hit"] += 1
    return _new_rollout(session, job, lane.fork_latest(), INCREMENTAL), True


def _run_parked(session: Connection, lane: Lane, job: Admission, found: Found) -> Started:
    """A parked rollout's owner is back (PARK-3): resume it on the fast path when the request
    allows (COMPAT-2), else fork its context and retire it (COMPAT-3). Either way the session
    now owns its task; a rejected continuation retires it (CACHE-3)."""
    parked = found.parked
    assert parked is not None and isinstance(parked.rollout, Rollout)
    engine, rollout, live = session.engine, parked.rollout, found.live
    session.adopt(parked.task, rollout)
    if live is None:
        engine.counters["create.cache_hit"] += 1
        ctx = rollout.ctx.fork()
        rollout.retire()
        return _new_rollout(session, job, ctx, INCREMENTAL), True
    engine.counters["create.fast_path"] += 1
    engine.counters["create.unparked"] += 1
    if parked.chain:  # an HTTP chain's: its responses stay forkable from the cache (PARK-4)
        engine.hydrated.copy_out(parked.response_id)
    else:
        engine.hydrated.discard(parked.response_id)  # the shared context moves on (HYD-3)
    try:
        live.continue_standard(job.items, job.texts, job.turn, job.settings)
    except Exception:
        live.retire()
        raise
    return live, False


def _run_hydrated(session: Connection, lane: Lane, job: Admission, found: Found) -> Started:
    """HYD-1: fork a recent stored response's cached context; only new items are processed."""
    assert found.cached is not None
    session.engine.counters["create.hydrated"] += 1
    return _new_rollout(session, job, found.cached.ctx.fork(), INCREMENTAL), True


def _run_store(session: Connection, lane: Lane, job: Admission, found: Found) -> Started:
    """COMPAT-4: the stored conversation, then the input, both on the full path."""
    stored, skip, counters = found.stored, found.resent, session.engine.counters
    assert stored is not None
    # The stored token trajectory, if any, continues as it was sampled (TOK-8).
    tokens = Trajectory.from_segments(stored.tokens) if stored.tokens else None
    ctx = Context(model_tokens=tokens)
    rollout = Rollout(session.engine, job.backend, job.settings, job.turn, job.mode, ctx)
    rollout.owner = session.owner
    if not skip:
        counters["create.store_hydrate"] += 1
        rollout.prepare(job.items, job.texts, path=FULL, history=stored.items, stored=stored.point)
        return rollout, True
    items, texts = job.items[skip:], job.texts[skip:]  # a resend's new items (COMPAT-10)
    try:
        rollout.prepare(items, texts, path=FULL, history=stored.items, stored=stored.point)
    except ProtocolError:  # run as the stateless create it is, whose errors name its input[i]
        return _run_stateless(session, lane, job, found)
    counters["create.store_hydrate"] += 1
    counters["create.stateless"] += 1  # no previous_response_id (COMPAT-5)
    counters["create.resent"] += 1
    return rollout, True


def _run_handed(session: Connection, lane: Lane, job: Admission, found: Found) -> Started:
    """PARK-21: the items of a rollout another node parked (and retired on handing them over),
    then the input, both on the full path, as the store path does; nothing of it is stored
    before this response (a ``store: false`` context stays off the store, STORE-1)."""
    handed = found.handed
    assert handed is not None
    session.engine.counters["create.handed_over"] += 1
    # The token trajectory continues as it was sampled there (LIVE-4); nothing of it is stored.
    tokens = Trajectory.from_segments([handed.tokens]) if handed.tokens is not None else None
    if tokens is not None:
        tokens.stored = (0, 0, 0)
    ctx = Context(model_tokens=tokens)
    rollout = Rollout(session.engine, job.backend, job.settings, job.turn, job.mode, ctx)
    rollout.owner = session.owner
    rollout.prepare(job.items, job.texts, path=FULL, history=handed.items)
    return rollout, True


def _run_resent(session: Connection, lane: Lane, job: Admission, found: Found) -> Started:
    """COMPAT-7: a fork of the context of the response whose full item list the input begins
    with; pre-inference runs only over the items after it. Stored, its record extends that
    response's chain when that one was stored (STORE-5: only the new items are written). A
    create this rejects is run on the stateless path instead, whose errors name the
    request's own ``input[i]`` (COMPAT-8)."""
    cached = found.cached
    assert cached is not None
    try:
        rollout = _new_rollout(session, job, cached.ctx.fork(), INCREMENTAL, skip=found.resent)
    except ProtocolError:
        return _run_stateless(session, lane, job, found)
    session.engine.counters["create.stateless"] += 1  # no previous_response_id (COMPAT-5)
    session.engine.counters["create.resent"] += 1
    return rollout, True


def _run_stateless(session: Connection, lane: Lane, job: Admission, found: Found) -> Started:
    """COMPAT-5: full pre-inference over the whole input."""
    session.engine.counters["create.stateless"] += 1
    return _new_rollout(session, job, None, FULL), True


def _run_conversation(session: Connection, lane: Lane, job: Admission, found: Found) -> Started:
    """CONV-6: a conversation no stored response stands for: its items (already before the
    input, ``_join``) on the full path."""
    session.engine.counters["create.conversation"] += 1
    return _new_rollout(session, job, None, FULL), True


_RUNS: dict[LoadPath, Callable[[Connection, Lane, Admission, Found], Started]] = {
    LoadPath.FAST: _run_fast,
    LoadPath.CACHE: _run_cache,
    LoadPath.PARKED: _run_parked,
    LoadPath.HYDRATED: _run_hydrated,
    LoadPath.STORE: _run_store,
    LoadPath.HANDED: _run_handed,
    LoadPath.CONVERSATION: _run_conversation,
    LoadPath.RESENT: _run_resent,
    LoadPath.STATELESS: _run_stateless,
}


async def _require_store(store: ResponseStore) -> None:
    """A ``store: true`` create is refused up front while the store is known to be down, so no
    model time is spent on a response that could not be kept; each such request probes the
    store again, so service resumes by itself (STORE-8)."""
    if not store.available and not await store.health():
        raise store_unavailable()


def _new_rollout(
    session: Connection, job: Admission, ctx: Context | None, path: str, skip: int = 0
) -> Rollout:
    """A new rollout on ``ctx`` over the input, less its first ``skip`` items (which ``ctx``
    holds already: a resend, COMPAT-7)."""
    rollout = Rollout(session.engine, job.backend, job.settings, job.turn, job.mode, context=ctx)
    rollout.owner = session.owner  # what it stores and parks belongs to the requester (OWN-1)
    items, texts = (job.items[skip:], job.texts[skip:]) if skip else (job.items, job.texts)
    rollout.prepare(items, texts, path=path)
    return rollout


def _after_turn(
    engine: Engine, lane: Lane, job: Admission, turn: Turn, rollout: Rollout, status: str
) -> None:
    """Update the lane cache after a response's terminal frame (CACHE-1..CACHE-3), and publish a
    stored response's context to the process's hydration cache (HYD-1). After steering,
    ``turn`` is the last successor: it is the lane's latest."""
    if status in ("completed", "incomplete"):
        live = rollout if rollout.waiting else None
        params = msgspec.structs.replace(job.params, input=[]) if live is not None else None
        lane.replace(CacheEntry(turn.stream.id, rollout.ctx, job.backend, live, params))
        _publish(engine, turn.stream.id, rollout, job)
    elif job.prev is not None and turn is job.turn:
        lane.evict(job.prev)


def _publish(engine: Engine, response_id: str, rollout: Rollout, job: Admission) -> None:
    """HYD-1: a stored response's context, by id; COMPAT-7: every response's, by its owner and
    the digest of its full item list, so that a resend of that list continues it."""
    cache = engine.hydrated
    if not cache.max_bytes:
        return
    cache.publish(
        response_id,
        rollout.ctx,
        job.backend,
        rollout.owner,
        stored=job.settings.store,
        resendable=True,
        sent=job.sent,
    )
