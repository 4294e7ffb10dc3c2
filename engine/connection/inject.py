"""``response.inject``, OpenAI's multi-agent beta verb, on both rollout modes (SPEC: INJECT-1..9).

A ``response.inject {response_id, input}`` commits client-owned tool outputs into an active
response that waits for them, atomically, and is answered ``response.inject.created`` or
``response.inject.failed``. What "waits for them" means depends on the target's mode:

* append mode (§8): the response itself is suspended (``response.done`` sent); the outputs are
  committed into its rollout at once and the same response resumes when every call is answered.
* standard mode (§7), only on a connection that opted into the beta (``OpenAI-Beta:
  responses_multi_agent=v1``): the target completed with function calls and its rollout waits
  in its lane's cache (COMPAT-1). The outputs are checked and held here; once every call is
  answered they become the input of a continuation queued on the target's lane, exactly the
  create a client would send (``previous_response_id`` = the target, the target's settings),
  so the fast path (COMPAT-2) resumes the rollout in a successor response. One admission path,
  one commit path: nothing here samples or renders.

The session finds the target and calls in; this module holds the standard-mode outputs that
wait for their siblings (at most one entry per lane, each bounded by its calls, LIM-3).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from engine.connection.lane import CacheEntry, Lane
from engine.conversation.validation import validate
from engine.rollout.coroutine import Rollout
from protocol.codec import parse_input
from protocol.errors import InvalidRequest, NotFound, ProtocolError, TooManyRequests
from protocol.events import InjectError, InjectFailed, ResponseInject
from protocol.items import InputItem, OpaqueItem, ToolOutput
from protocol.response import CreateParams

MULTI_AGENT_BETA = "responses_multi_agent=v1"  # the OpenAI-Beta value of the beta (INJECT-1)


def tool_outputs(raw: list[Any]) -> list[InputItem]:
    """The input of an append or inject: tool outputs only (APPEND-3, INJECT-3), and answers to
    MCP approval requests (MCP-9)."""
    items = parse_input(raw)
    for index, item in enumerate(items):
        approval = isinstance(item, OpaqueItem) and item.type == "mcp_approval_response"
        if not isinstance(item, ToolOutput) and not approval:
            raise InvalidRequest(
                "invalid_append_input",
                "Only function_call_output and custom_tool_call_output items can be appended"
                " to a response.",
                f"input[{index}].type",
            )
    return items


def unknown_target(response_id: str, finished: bool) -> ProtocolError:
    if finished:
        return InvalidRequest(
            "response_already_completed",
            f"Response '{response_id}' has already completed.",
            "response_id",
        )
    return NotFound(
        "response_not_found",
        f"No active response with id '{response_id}' on this connection.",
        "response_id",
    )


def inject_failed(event: ResponseInject, finished: bool) -> InjectFailed:
    """``response.inject.failed`` for a response that takes no input: it has no sequence of its
    own to number the event with, so ``sequence_number`` is 0 (APPEND-5, INJECT-6)."""
    err = unknown_target(event.response_id, finished)
    return InjectFailed(
        sequence_number=0,
        response_id=event.response_id,
        error=InjectError(code=err.code, message=err.message),
        input=_echoable(event.input),
    )


def _echoable(raw: list[Any]) -> list[Any]:
    """The client's input as it may be echoed back: only if it is a list of valid items
    (echoing arbitrary JSON would break clients' event parsing, CONF-1)."""
    try:
        return list(parse_input(raw))
    except ProtocolError:
        return []


@dataclass
class _Held:
    """Accepted outputs of one standard-mode target, waiting for the rest of its calls."""

    raw: list[Any] = field(default_factory=list)  # as sent: they become a create's input
    call_ids: set[str] = field(default_factory=set)


class HeldOutputs:
    """Standard-mode injects per target (INJECT-5): accepted, answered ``inject.created``, and
    handed on as one continuation once the target's last pending call is answered."""

    def __init__(self) -> None:
        self._held: dict[str, _Held] = {}

    def accept(
        self, lanes: Iterable[Lane], found: Target, event: ResponseInject
    ) -> CreateParams | None:
        """Check ``event`` against the target and what it already holds; raise without any change
        when it is not acceptable. Returns the continuation to queue once every call of the
        target is answered, else None (the outputs are held)."""
        target, (lane, entry, rollout) = event.response_id, found
        self._drop_stale(lanes, target)
        items = tool_outputs(event.input)
        held = self._held.get(target) or _Held()
        for index, item in enumerate(items):
            assert isinstance(item, ToolOutput)
            if item.call_id in held.call_ids:
                raise InvalidRequest(
                    "duplicate_tool_output",
                    f"Duplicate function call output for call_id '{item.call_id}'.",
                    f"input[{index}].call_id",
                )
        validate(rollout.ctx, items, rollout.backend.supports)  # VAL-1..VAL-3, no commit
        if lane.queue.full():
            raise TooManyRequests(
                "websocket_queue_full",
                f"Too many queued requests on this lane (max {lane.queue.maxsize}).",
                None,
            )
        answered = held.call_ids | {i.call_id for i in items if isinstance(i, ToolOutput)}
        if any(call.call_id not in answered for call in rollout.ctx.pending_calls()):
            held.raw.extend(event.input)
            held.call_ids = answered
            self._held[target] = held
            return None
        self._held.pop(target, None)
        assert entry.params is not None  # waiting_standard only finds entries that have them
        return msgspec.structs.replace(
            entry.params,
            input=[*held.raw, *event.input],
            previous_response_id=target,
            stream_id=lane.name,
            rollout_mode="standard",
            generate=True,
        )

    def _drop_stale(self, lanes: Iterable[Lane], target: str) -> None:
        """Outputs held for a response that no longer waits (a create continued or replaced it)
        are dropped: the continuation they were for can no longer happen. So at most one entry
        per lane is held (LIM-3)."""
        live = {lane.latest.response_id for lane in lanes if lane.latest is not None}
        for response_id in [r for r in self._held if r != target and r not in live]:
            del self._held[response_id]


Target = tuple[Lane, CacheEntry, Rollout]


def waiting_standard(lanes: Iterable[Lane], response_id: str) -> Target | None:
    """The lane whose latest response is ``response_id`` with its standard-mode rollout waiting
    for that response's tool outputs (COMPAT-1): a standard-mode inject target (INJECT-2)."""
    for lane in lanes:
        entry = lane.latest
        if entry is None or entry.response_id != response_id:
            continue
        rollout = entry.rollout
        if rollout is None or entry.params is None:  # no create of this lane to continue it
            continue  # with (a parked rollout's hand-over entry)
        if rollout.waiting and rollout.turn.stream.id == response_id:
            return lane, entry, rollout
    return None
