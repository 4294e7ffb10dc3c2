"""The transport-independent agent loop shared by every client.

A client only knows how to *start* a rollout and how to *answer* tool calls on its transport;
both return a ``TurnEnd`` (the model stopped: to wait for tools, or for good). ``drive`` runs
the tools between turns and accumulates the ``RolloutResult``, so the three clients cannot drift
apart in how they run tools, count turns or sum usage.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from clients.exceptions import ApiError, AppendRejected, ProtocolViolation, RolloutFailed
from clients.toolbox import ToolRegistry
from protocol import events as ev
from protocol.items import FunctionCall, Message, OutputItem, text_of
from protocol.response import (
    InputTokensDetails,
    OutputTokensDetails,
    Response,
    Usage,
)

# ---------------------------------------------------------------------- public result types


@dataclass(frozen=True, slots=True)
class ToolCallRecord:
    call_id: str
    name: str
    arguments: str
    output: str
    ok: bool
    seconds: float


@dataclass
class RolloutResult:
    response_ids: list[str]  # one per response: a single id in append mode
    final_text: str
    output: list[OutputItem]  # the final turn's output items
    tool_calls: list[ToolCallRecord]
    turns: int  # model sampling turns (tool-call turns plus the final answer)
    usage: Usage  # whole-rollout usage
    elapsed_s: float
    events: int

    @property
    def response_id(self) -> str:
        return self.response_ids[-1]


@dataclass
class Hooks:
    """Progress callbacks (sync, called on the event loop; keep them cheap)."""

    on_event: Callable[[ev.ServerEvent], None] | None = None
    on_tool_call: Callable[[FunctionCall], None] | None = None
    on_tool_result: Callable[[ToolCallRecord], None] | None = None
    on_turn: Callable[[TurnEnd], None] | None = None


# ---------------------------------------------------------------------- turns


@dataclass
class TurnEnd:
    """The model stopped: ``calls`` to run now (empty when the rollout is finished)."""

    response: Response
    items: list[OutputItem]  # output items produced in this turn
    calls: list[FunctionCall]
    usage: Usage | None  # usage to add to the rollout total (None: counted later)

    @property
    def text(self) -> str:
        return "\n".join(
            text_of(item.content)
            for item in self.items
            if isinstance(item, Message) and item.role == "assistant"
        )


class TurnReader:
    """Folds server events into turns and checks the ordering rules a client can see.

    ``append=True``: one response spans the rollout; a turn ends at ``response.done`` (run the
    pending calls) or at the terminal event, and output items accumulate in the snapshot.
    ``append=False``: each response is one turn and ends at its terminal event.
    """

    def __init__(self, hooks: Hooks, *, append: bool) -> None:
        self.hooks = hooks
        self.append = append
        self.response_ids: list[str] = []
        self.events = 0
        self._expected_seq: int | None = None
        self._seen_items = 0

    def feed(self, event: ev.ServerEvent) -> TurnEnd | None:
        """Account one event; returns the ``TurnEnd`` when this event ends a turn."""
        self.events += 1
        if self.hooks.on_event is not None:
            self.hooks.on_event(event)
        if isinstance(event, ev.ErrorEvent):
            raise ApiError.from_event(event)
        self._check_sequence(event)
        if isinstance(event, ev.ResponseCreated):
            self._created(event.response)
        elif isinstance(event, ev.ResponseDone):
            return self._suspended(event)
        elif isinstance(event, ev.ResponseCompleted):
            return self._completed(event.response)
        elif isinstance(event, ev.ResponseFailed | ev.ResponseIncomplete):
            raise RolloutFailed(event.response)
        elif isinstance(event, ev.InjectFailed):
            raise AppendRejected(
                400, event.error.code, event.error.message, "input", "invalid_request_error"
            )
        return None

    def _check_sequence(self, event: ev.ServerEvent) -> None:
        seq = getattr(event, "sequence_number", None)
        if isinstance(event, ev.ResponseCreated):
            self._expected_seq = 0
        if seq is None or self._expected_seq is None:
            raise ProtocolViolation(f"{_tag(event)} arrived outside a response")
        if seq != self._expected_seq:
            raise ProtocolViolation(
                f"{_tag(event)} has sequence_number {seq}, expected {self._expected_seq}"
            )
        self._expected_seq += 1

    def _created(self, response: Response) -> None:
        if self.append and self.response_ids:
            raise ProtocolViolation("append mode opened a second response")
        self.response_ids.append(response.id)
        self._seen_items = 0

    def _new_items(self, response: Response) -> list[OutputItem]:
        if response.id != self.response_ids[-1]:
            raise ProtocolViolation(f"event for {response.id} inside {self.response_ids[-1]}")
        items = response.output[self._seen_items :]
        self._seen_items = len(response.output)
        return list(items)

    def _suspended(self, event: ev.ResponseDone) -> TurnEnd:
        if not self.append:
            raise ProtocolViolation("response.done in standard mode")
        items = self._new_items(event.response)
        by_id = {i.call_id: i for i in event.response.output if isinstance(i, FunctionCall)}
        if not event.pending_calls:
            raise ProtocolViolation("response.done without pending calls")
        missing = [p.call_id for p in event.pending_calls if p.call_id not in by_id]
        if missing:
            raise ProtocolViolation(f"response.done with unknown pending calls: {missing}")
        calls = [by_id[p.call_id] for p in event.pending_calls]
        return TurnEnd(event.response, items, calls, usage=None)

    def _completed(self, response: Response) -> TurnEnd:
        items = self._new_items(response)
        calls = [] if self.append else [i for i in items if isinstance(i, FunctionCall)]
        self._expected_seq = None
        return TurnEnd(response, items, calls, usage=response.usage)


def _tag(event: ev.ServerEvent) -> str:
    return str(type(event).__struct_config__.tag)


# ---------------------------------------------------------------------- running tools


async def run_tools(
    tools: ToolRegistry, calls: list[FunctionCall], hooks: Hooks
) -> list[ToolCallRecord]:
    """Run every call of a turn concurrently; results keep the calls' order."""
    return list(await asyncio.gather(*(_run_one(tools, call, hooks) for call in calls)))


async def _run_one(tools: ToolRegistry, call: FunctionCall, hooks: Hooks) -> ToolCallRecord:
    if hooks.on_tool_call is not None:
        hooks.on_tool_call(call)
    start = time.perf_counter()
    outcome = await tools.execute(call.name, call.arguments)
    record = ToolCallRecord(
        call_id=call.call_id,
        name=call.name,
        arguments=call.arguments,
        output=outcome.output,
        ok=outcome.ok,
        seconds=time.perf_counter() - start,
    )
    if hooks.on_tool_result is not None:
        hooks.on_tool_result(record)
    return record


def output_items(records: list[ToolCallRecord]) -> list[dict[str, Any]]:
    """``function_call_output`` input items answering ``records``."""
    return [
        {"type": "function_call_output", "call_id": r.call_id, "output": r.output} for r in records
    ]


# ---------------------------------------------------------------------- the loop

Begin = Callable[[], Awaitable[TurnEnd]]
Answer = Callable[[TurnEnd, list[ToolCallRecord]], Awaitable[TurnEnd]]


@dataclass
class _Tally:
    turns: int = 0
    usage: Usage = field(default_factory=lambda: Usage(0, 0, 0))
    calls: list[ToolCallRecord] = field(default_factory=list)

    def add_turn(self, end: TurnEnd, hooks: Hooks) -> None:
        self.turns += 1
        if end.usage is not None:
            self.usage = add_usage(self.usage, end.usage)
        if hooks.on_turn is not None:
            hooks.on_turn(end)


async def drive(
    begin: Begin, answer: Answer, tools: ToolRegistry, reader: TurnReader
) -> RolloutResult:
    """Start, then run tools and answer until a turn ends with no calls."""
    start = time.perf_counter()
    tally = _Tally()
    end = await begin()
    tally.add_turn(end, reader.hooks)
    while end.calls:
        records = await run_tools(tools, end.calls, reader.hooks)
        tally.calls.extend(records)
        end = await answer(end, records)
        tally.add_turn(end, reader.hooks)
    return RolloutResult(
        response_ids=list(reader.response_ids),
        final_text=end.text,
        output=end.items,
        tool_calls=tally.calls,
        turns=tally.turns,
        usage=tally.usage,
        elapsed_s=time.perf_counter() - start,
        events=reader.events,
    )


def add_usage(a: Usage, b: Usage) -> Usage:
    return Usage(
        input_tokens=a.input_tokens + b.input_tokens,
        output_tokens=a.output_tokens + b.output_tokens,
        total_tokens=a.total_tokens + b.total_tokens,
        input_tokens_details=InputTokensDetails(
            cached_tokens=a.input_tokens_details.cached_tokens
            + b.input_tokens_details.cached_tokens,
            cache_write_tokens=a.input_tokens_details.cache_write_tokens
            + b.input_tokens_details.cache_write_tokens,
        ),
        output_tokens_details=OutputTokensDetails(
            reasoning_tokens=a.output_tokens_details.reasoning_tokens
            + b.output_tokens_details.reasoning_tokens
        ),
    )


def create_body(
    model: str,
    input: str | list[Any],
    tools: ToolRegistry,
    instructions: str | None,
    extra: dict[str, Any],
) -> dict[str, Any]:
    """The fields every create carries (tools and instructions are resent on continuations,
    since a continuation does not inherit them)."""
    body: dict[str, Any] = {"model": model, "input": input, "tools": tools.definitions()}
    if instructions is not None:
        body["instructions"] = instructions
    body.update(extra)
    return body


class RolloutClient(Protocol):
    """What every client offers: run a rollout with a tool registry; release the connection."""

    async def run(
        self,
        model: str,
        input: str | list[Any],
        tools: ToolRegistry,
        instructions: str | None = None,
        **extra: Any,
    ) -> RolloutResult: ...

    async def close(self) -> None: ...
