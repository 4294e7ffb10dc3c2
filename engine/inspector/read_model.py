"""The inspector's read model: samples live engine state into plain data (SPEC: INSP-1..INSP-8).

The server's ``/inspect`` page and feed show what ``Inspector.sample()`` returns. It reads
state the engine keeps anyway (sessions, lanes, rollouts, counters, the stage histogram) and
never writes it; it runs only when the feed's sampler ticks, never per event (INSP-3). Rows are
capped: past ``row_cap`` rollouts or connections only the counts grow.

Parts built elsewhere plug in without changes here:

* ``add_rollouts(state, source)``: more rollouts to list, e.g. ``"parked"`` ones that outlive
  their socket. ``source()`` yields ``(response_id, rollout)`` pairs.
* ``provide(name, fn)``: a section of plain values sampled each tick, e.g. ``"store"`` (backend,
  health) or ``"hydration"``. A provider must be cheap and must not block (report a cached
  health flag, not a round trip); one that raises shows ``{"error": ...}`` instead.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from engine.core import Engine
from engine.observe.turnlog import PRE_STAGES
from engine.rollout.coroutine import Rollout
from engine.rollout.state import RolloutState
from engine.store.framing import ANY_OWNER, OwnerFilter
from protocol.events import ErrorEvent, ResponseFailed, ServerEvent

if TYPE_CHECKING:
    from engine.connection.session import Session

ROW_CAP = 200  # rollouts and connections listed per snapshot (INSP-3)
ENDED_CAP = 20  # recently ended rollouts kept (summary and turns only, never the context)
ERRORS_CAP = 100  # the recent-errors ring (INSP-6)
SERIES_LEN = 120  # chart points: one minute at 2 Hz
Json = dict[str, Any]
Provider = Callable[[], Mapping[str, Any]]
RolloutSource = Callable[[], Iterable[tuple[str, Rollout]]]


# --------------------------------------------------------------------------- recent errors


@dataclass(frozen=True, slots=True)
class ErrorNote:
    at: float  # Unix time
    source: str  # "ws", "http" or "log"
    status: int | None
    code: str
    message: str
    # Whose request it was (INSP-9): a key's viewer sees its own; ANY_OWNER = not known (a
    # server log line, a request refused before its key was read): operators only.
    owner: OwnerFilter = ANY_OWNER

    def row(self) -> Json:
        return {"at": self.at, "source": self.source, "status": self.status, "code": self.code,
                "message": self.message}  # fmt: skip


class ErrorRing:
    """The last ``ERRORS_CAP`` errors: appended where they happen, read when sampled."""

    def __init__(self, size: int = ERRORS_CAP) -> None:
        self.notes: deque[ErrorNote] = deque(maxlen=size)
        self.total = 0

    def note(
        self,
        source: str,
        status: int | None,
        code: str,
        message: str,
        owner: OwnerFilter = ANY_OWNER,
    ) -> None:
        self.notes.append(ErrorNote(time.time(), source, status, code, message[:300], owner))
        self.total += 1

    def seen_by(self, scope: OwnerFilter) -> tuple[list[Json], int]:
        """The newest notes ``scope`` may see (INSP-9), and how many of the kept ones it may."""
        if scope is ANY_OWNER:
            return [note.row() for note in list(self.notes)[-30:]], self.total
        own = [note for note in self.notes if note.owner == scope]
        return [note.row() for note in own[-30:]], len(own)


NOTED_EVENTS = frozenset({ErrorEvent, ResponseFailed})  # what ``note_event`` notes; a sink may
# ask this set first and call it for these only


def note_event(
    ring: ErrorRing, source: str, event: ServerEvent, owner: OwnerFilter = ANY_OWNER
) -> None:
    """Called by the sinks for every event they write: one type test, and a note only for an
    ``error`` event or a ``response.failed`` (INSP-6)."""
    kind = type(event)
    if kind is ErrorEvent:
        assert isinstance(event, ErrorEvent)
        ring.note(source, event.status, event.error.code or "", event.error.message, owner)
    elif kind is ResponseFailed:
        assert isinstance(event, ResponseFailed)
        error = event.response.error
        code = error.code if error is not None else "failed"
        message = error.message if error is not None else ""
        text = f"{event.response.id}: {message}"
        ring.note(source, None, f"response.failed {code}", text, owner)


class ErrorLogHandler(logging.Handler):
    """Server-side faults (warnings and errors of the ``rollout.*`` loggers) into the ring.

    Only the formatted message, never a traceback: the page is for operators, but internal
    exception text stays in the log (ERR-3)."""

    def __init__(self, ring: ErrorRing) -> None:
        super().__init__(logging.WARNING)
        self.ring = ring

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:
            message = str(record.msg)
        self.ring.note("log", None, record.name, message)


# --------------------------------------------------------------------------- stage charts


class StageSeries:
    """Per-record mean stage times over each sampling interval, read from the stage histogram
    (OBS-2) as differences of its sums and counts: no hook on the hot path (INSP-7)."""

    def __init__(self, histogram: Any, length: int = SERIES_LEN) -> None:
        self._histogram = histogram
        self.points: deque[Json] = deque(maxlen=length)
        self.means: Json = {}  # since the engine started: per-record means and record count
        self._last: tuple[float, dict[str, float], dict[str, float]] | None = None

    def _read(self) -> tuple[dict[str, float], dict[str, float]]:
        sums: dict[str, float] = {}
        counts: dict[str, float] = {}
        for family in self._histogram.collect():
            for sample in family.samples:
                stage = sample.labels.get("stage", "")
                if sample.name.endswith("_sum"):
                    sums[stage] = sample.value
                elif sample.name.endswith("_count"):
                    counts[stage] = sample.value
        return sums, counts

    def sample(self, now: float) -> None:
        sums, counts = self._read()
        records = counts.get("post", 0.0)
        self.means = {
            "pre_ms": _ms(sum(sums.get(stage, 0.0) for stage in PRE_STAGES), records),
            "model_ms": _ms(sums.get("model", 0.0), counts.get("model", 0.0)),
            "post_ms": _ms(sums.get("post", 0.0), records),
            "records": int(records),
        }
        last, self._last = self._last, (now, sums, counts)
        if last is None:
            return
        then, old_sums, old_counts = last

        def delta(table: dict[str, float], old: dict[str, float], stage: str) -> float:
            return table.get(stage, 0.0) - old.get(stage, 0.0)

        records = delta(counts, old_counts, "post")  # the worker times every record once
        modelled = delta(counts, old_counts, "model")
        pre = sum(delta(sums, old_sums, stage) for stage in PRE_STAGES)
        self.points.append(
            {
                "t": round(now, 2),
                "pre_ms": _ms(pre, records),
                "model_ms": _ms(delta(sums, old_sums, "model"), modelled),
                "post_ms": _ms(delta(sums, old_sums, "post"), records),
                "per_s": round(records / max(now - then, 1e-6), 2),
            }
        )


def _ms(seconds: float, n: float) -> float | None:
    return round(seconds / n * 1000, 3) if n > 0 else None


# --------------------------------------------------------------------------- the read model


def _rate(hits: int, misses: int) -> Json:
    total = hits + misses
    return {"hits": hits, "misses": misses, "rate": round(hits / total, 4) if total else None}


class Inspector:
    """Samples sessions, rollouts, counters and providers; owns the error ring and the charts.

    ``sources`` give the live sessions (the server's WebSocket connections, in-flight HTTP
    requests); the inspector only reads them."""

    def __init__(
        self,
        engine: Engine,
        sources: Iterable[Callable[[], Iterable[Session]]],
        *,
        row_cap: int = ROW_CAP,
    ) -> None:
        self.engine = engine
        self._sources = list(sources)
        self.row_cap = row_cap
        self.errors = ErrorRing()
        self.stages = StageSeries(engine.metrics.pending)
        self._providers: dict[str, Provider] = {"store": self._store_status}
        self._extra_rollouts: dict[str, RolloutSource] = {}
        self._shown: dict[str, tuple[Rollout, Json]] = {}  # last tick's rows, to see endings
        # Recently ended rollouts with their owner, who alone may see them (INSP-9).
        self.ended: deque[tuple[str | None, Json]] = deque(maxlen=ENDED_CAP)
        self._ended_turns: dict[str, tuple[str | None, str, list[Json]]] = {}
        self.started_at = time.time()
        self.samples = 0

    # ------------------------------------------------------------------ plug-in points
    def provide(self, name: str, fn: Provider) -> None:
        """A section sampled each tick (replaces one of the same name, e.g. ``"store"``)."""
        self._providers[name] = fn

    def add_rollouts(self, state: str, source: RolloutSource) -> None:
        """Rollouts no session owns, listed under ``state`` (e.g. ``"parked"``)."""
        self._extra_rollouts[state] = source

    # ------------------------------------------------------------------ sampling
    def sessions(self) -> Iterator[Session]:
        for source in self._sources:
            yield from source()

    def sample(self) -> Json:
        """One snapshot of everything (an open server, an operator key)."""
        return self.sample_for([ANY_OWNER])[ANY_OWNER]

    def sample_for(self, scopes: Iterable[OwnerFilter]) -> dict[OwnerFilter, Json]:
        """One snapshot per scope: ``ANY_OWNER`` sees everything, an owner digest only its own
        connections and rollouts, and none of the recent errors, which name no owner (INSP-9).
        Cost grows with the live rollouts only by a phase count and a token sum each per scope,
        rows beyond ``row_cap`` are not built (INSP-3)."""
        now = time.time()
        self.samples += 1
        self.stages.sample(now)
        shared: Json = {
            "type": "snapshot",
            "t": round(now, 2),
            "uptime_s": round(now - self.started_at, 1),
            "row_cap": self.row_cap,
            "caches": self._caches(),
            "sections": self._sections(),
            "series": list(self.stages.points),
            "stage_means": self.stages.means,
        }
        out: dict[OwnerFilter, Json] = {}
        listed: set[str] = set()
        for scope in set(scopes):
            connections, rollouts, totals = self._walk(scope)
            listed.update(row["id"] for row in rollouts)
            everything = scope is ANY_OWNER
            errors, errors_total = self.errors.seen_by(scope)
            out[scope] = {
                **shared,
                "totals": totals,
                "connections": connections,
                "rollouts": rollouts,
                "ended": [row for owner, row in self.ended if everything or owner == scope],
                "errors": errors,
                "errors_total": errors_total,
            }
        self._note_endings(listed)
        return out

    def _walk(self, scope: OwnerFilter) -> tuple[list[Json], list[Json], Json]:
        """One pass over the live sessions and rollouts of ``scope``. Synchronous, so nothing
        changes under it; per rollout only a phase test and a token count unless it gets a
        row."""
        cap = self.row_cap
        everything = scope is ANY_OWNER
        connections: list[Json] = []
        rows: list[Json] = []
        sessions = running = suspended = held = 0
        for session in self.sessions():
            if not everything and session.owner != scope:
                continue
            sessions += 1
            label = _label(session)
            if len(connections) < cap:
                connections.append(self._connection(session, label))
            for rollout in session.rollouts.values():
                phase = rollout.state
                if phase is RolloutState.ENDED:
                    continue
                ctx = rollout.ctx
                held += len(ctx.header) + len(ctx.tokens)
                is_suspended = phase is RolloutState.SUSPENDED
                suspended += is_suspended
                running += not is_suspended
                if len(rows) < cap:
                    state = "suspended" if is_suspended else "running"
                    rows.append(self._row(rollout, state, label))
        counts: Json = {"connections": sessions, "running": running, "suspended": suspended}
        for state, source in self._extra_rollouts.items():
            counts[state] = 0
            for _, rollout in source():
                if not everything and rollout.owner != scope:
                    continue
                counts[state] += 1
                held += rollout.ctx.prompt_tokens
                if len(rows) < cap:
                    rows.append(self._row(rollout, state, None))
        counts["tokens_held"] = held
        return connections, rows, counts

    def _connection(self, session: Session, label: str) -> Json:
        sink = session.sink  # a sink may count its frames (the WebSocket driver's does)
        frames_in, frames_out = getattr(sink, "frames_in", None), getattr(sink, "frames_out", None)
        return {
            "id": label,
            "transport": session.transport,
            "age_s": round(asyncio.get_running_loop().time() - session.opened_at, 1),
            "lanes": [name or "(default)" for name in list(session.lanes)[:8]],
            "lanes_n": len(session.lanes),
            "frames_in": frames_in,
            "frames_out": frames_out,
            "rollouts": len(session.rollouts),
        }

    def _row(self, rollout: Rollout, state: str, connection: str | None) -> Json:
        idle = rollout.idle_for
        pending = rollout.pending if state != "running" else []
        unanswered = rollout.ctx.unanswered
        row: Json = {
            "id": rollout.id,
            "state": state,
            "mode": rollout.mode.value,
            "model": rollout.settings.model,
            "connection": connection,
            "lane": rollout.turn.stream.stream_id,
            "response_id": rollout.turn.stream.id,
            "age_s": round(time.time() - rollout.started_at, 1),
            "idle_s": round(idle, 1) if idle is not None else None,
            "tokens": rollout.ctx.prompt_tokens,
            "pending": [
                {"call_id": call.call_id, "name": call.name}
                for call in pending
                if call.call_id in unanswered
            ],
            "turns": rollout.accounting.history.count,
        }
        self._shown[rollout.id] = (rollout, row)
        return row

    def _note_endings(self, listed: set[str]) -> None:
        """Rows shown last tick and gone now: keep their summary and turns (never the rollout
        or its context) in the bounded ``ended`` ring."""
        for rollout_id in [rid for rid in self._shown if rid not in listed]:
            rollout, row = self._shown.pop(rollout_id)
            if rollout.state is not RolloutState.ENDED:
                continue  # still live, just past the row cap this tick
            summary = {**row, "state": "ended", "status": rollout.turn.status, "pending": []}
            summary.update(
                response_id=rollout.turn.stream.id,
                tokens=rollout.ctx.prompt_tokens,
                turns=rollout.accounting.history.count,
                idle_s=None,
            )
            if len(self.ended) == self.ended.maxlen:
                self._ended_turns.pop(self.ended[0][1]["id"], None)
            self.ended.append((rollout.owner, summary))
            self._ended_turns[rollout_id] = (rollout.owner, rollout.turn.status, _turns(rollout))

    def _caches(self) -> Json:
        c = self.engine.counters
        hydration = None
        if "hydration.hit" in c or "hydration.miss" in c:
            hydration = _rate(c["hydration.hit"], c["hydration.miss"])
        return {
            "connection": _rate(
                c["create.fast_path"] + c["create.cache_hit"] + c["create.fork"],
                c["create.cache_miss"],
            ),
            "hydration": hydration,
            "paths": {k.split(".", 1)[1]: v for k, v in c.items() if k.startswith("create.")},
        }

    def _sections(self) -> Json:
        out: Json = {}
        for name, provider in self._providers.items():
            try:
                out[name] = dict(provider())
            except Exception as exc:  # one broken provider must not blank the page
                out[name] = {"error": type(exc).__name__}
        return out

    def _store_status(self) -> Mapping[str, Any]:
        store = self.engine.store  # cached state only: no round trip per tick (STORE-8)
        status: Json = {"backend": store.kind, "available": store.available}
        size = getattr(store, "__len__", None)
        if size is not None:
            status["entries"] = size()
        return status

    def pause(self) -> None:
        """Nobody watches any more: drop last tick's rows, so no ended rollout (or its
        context) is kept alive by the inspector until the next viewer comes."""
        self._shown.clear()

    # ------------------------------------------------------------------ one rollout
    def turns(self, rollout_id: str, scope: OwnerFilter = ANY_OWNER) -> Json:
        """A rollout's turn history (INSP-5): live, or among the recently ended. Another
        owner's rollout is not found, exactly as an unknown id (INSP-9)."""
        rollout = self.find(rollout_id)
        if rollout is not None and (scope is ANY_OWNER or rollout.owner == scope):
            return {"type": "turns", "rollout_id": rollout_id, "found": True,
                    "status": rollout.turn.status, "turns": _turns(rollout)}  # fmt: skip
        owner, status, turns = self._ended_turns.get(rollout_id, (None, "unknown", []))
        if rollout is not None or (scope is not ANY_OWNER and owner != scope):
            status, turns = "unknown", []
        return {"type": "turns", "rollout_id": rollout_id, "found": status != "unknown",
                "status": status, "turns": turns}  # fmt: skip

    def find(self, rollout_id: str) -> Rollout | None:
        """On demand (a click), not per tick: a walk over the live rollouts."""
        for session in self.sessions():
            for rollout in list(session.rollouts.values()):
                if rollout.id == rollout_id:
                    return rollout
        for source in self._extra_rollouts.values():
            for _, rollout in source():
                if rollout.id == rollout_id:
                    return rollout
        return None


def _turns(rollout: Rollout) -> list[Json]:
    return [asdict(record) for record in rollout.accounting.history.turns]


def _label(session: Session) -> str:
    """A short stable name for a connection while it lives."""
    return f"{session.transport}-{id(session) & 0xFFFFFF:06x}"
