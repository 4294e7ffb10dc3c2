"""Steering (SPEC: STEER-1..STEER-9): user input for a live response of this connection.

A ``response.steer`` names a response by ``previous_response_id``. If that response is the
current response of a live rollout, the input is accepted (``response.steer.accepted``) and
queued on the rollout, which applies it itself:

* while it samples, at its next sampling boundary: the response ends ``incomplete`` (reason
  ``steered``) and a successor response continues the same coroutine with the input (or, if the
  step ended on its own first, the successor follows the normal terminal event);
* while it waits for tool outputs: ``response.steer.pending`` lists them, and the input is
  prepended to the input of the continuation that answers them (a fast-path resume).

Everything else fails with ``response.steer.failed``, which returns the uncommitted input.
This module holds the submission and its checks, and ``Steering``, the queue a rollout owns
(reached through ``Rollout.steer``, with its limit inside); ``Targets.steer`` finds the
target.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import msgspec

from engine.rollout.turn import ClientGone, Turn, now
from protocol.codec import parse_input
from protocol.errors import InvalidRequest, ProtocolError
from protocol.events import ResponseSteer, SteerError, SteerFailed, SteerRef
from protocol.items import InputItem, Message, ToolCall
from protocol.states import IllegalTransition
from protocol.stream import ResponseStream, new_id

MAX_PENDING_STEERS = 16  # queued per rollout; more is too_many_pending_steers (LIM-14)


@dataclass(slots=True)
class Steer:
    """One accepted submission, owned by the rollout until it is committed or fails."""

    id: str
    items: list[InputItem]
    raw: str | list[Any]  # the input as sent: returned if it cannot be committed
    target: str
    notified: bool = False  # response.steer.pending sent (at most once per submission)

    def ref(self) -> SteerRef:
        return SteerRef(previous_response_id=self.target, input=echo(self.raw), id=self.id)


class Steering:
    """Accepted steering input of one rollout, in submission order (STEER-2), until the rollout
    commits it (STEER-3, STEER-5) or returns it (STEER-6)."""

    def __init__(self) -> None:
        self._queued: list[Steer] = []

    def __bool__(self) -> bool:
        return bool(self._queued)

    async def submit(self, steer: Steer, turn: Turn, waiting_for: list[ToolCall] | None) -> None:
        """Accept ``steer`` for ``turn``, or refuse it at the limit (LIM-14). ``waiting_for``:
        the calls the rollout waits for, if it is suspended (then ``pending`` follows at once,
        STEER-5)."""
        stream = turn.stream
        if len(self._queued) >= MAX_PENDING_STEERS:
            message = f"At most {MAX_PENDING_STEERS} steering inputs can wait for one response."
            refused = SteerRef(previous_response_id=steer.target, input=echo(steer.raw))
            await turn.sink.send(stream.steer_failed(refused, "too_many_pending_steers", message))
            return
        self._queued.append(steer)
        await turn.sink.send(stream.steer_accepted(steer.id))
        if waiting_for is not None:
            steer.notified = True
            await turn.sink.send(stream.steer_pending(steer.id, waiting_for))

    def items(self) -> list[InputItem]:
        """The queued input, in order; it stays queued until ``clear``."""
        return [item for steer in self._queued for item in steer.items]

    def take(self) -> list[InputItem]:
        """The queued input, now committed by the caller."""
        items = self.items()
        self._queued = []
        return items

    def clear(self) -> None:
        self._queued = []

    def successor(self, turn: Turn) -> Turn:
        """The response that continues a steered one: same settings, the steering input as its
        input, ``previous_response_id`` = the steered response (STEER-4)."""
        old = turn.stream.response
        response = msgspec.structs.replace(
            old,
            id=new_id("resp"),
            created_at=now(),
            status="in_progress",
            completed_at=None,
            error=None,
            incomplete_details=None,
            output=[],
            usage=None,
            previous_response_id=old.id,
            safety=None,
        )
        stream = ResponseStream(response, turn.stream.stream_id, turn.stream.full_echo)
        return Turn(stream, turn.sink, self.items())

    async def notify_pending(self, turn: Turn, calls: list[ToolCall]) -> None:
        """``response.steer.pending``, after the response stopped for tool outputs (STEER-5)."""
        for steer in self._queued:
            if not steer.notified:
                steer.notified = True
                await turn.sink.send(turn.stream.steer_pending(steer.id, calls))

    async def fail_all(self, turn: Turn, code: str, message: str) -> None:
        """Return every uncommitted steer's input (STEER-6); a closed socket hears nothing."""
        steers, self._queued = self._queued, []
        with contextlib.suppress(ClientGone, IllegalTransition):
            for steer in steers:
                await turn.sink.send(turn.stream.steer_failed(steer.ref(), code, message))


def steer_items(raw: str | list[Any]) -> list[InputItem]:
    """Steering input: a string, or a non-empty list of user messages (PROTOCOL §2.2)."""
    if isinstance(raw, list) and not raw:
        raise InvalidRequest("invalid_input", "Steering input must not be empty.", "input")
    items = parse_input(raw)
    for index, item in enumerate(items):
        if not (isinstance(item, Message) and item.role == "user"):
            raise InvalidRequest(
                "invalid_input", "Steering accepts only user messages.", f"input[{index}]"
            )
    return items


def unattached(event: ResponseSteer, finished: bool) -> SteerFailed:
    """A target that is not live here: there is no response stream to number the event with,
    so ``sequence_number`` is 0, and it carries no ``stream_id`` (STEER-7)."""
    if finished:
        code, message = "response_already_completed", "The response has already completed."
    else:
        code = "response_not_found"
        message = f"No live response with id '{event.previous_response_id}' on this connection."
    return SteerFailed(
        sequence_number=0,
        error=SteerError(code=code, message=message),
        steer=SteerRef(previous_response_id=event.previous_response_id, input=echo(event.input)),
    )


def echo(raw: str | list[Any]) -> str | list[Any]:
    """Steering input as it may be returned: a string as sent, a list of user messages as
    parsed. Anything else is not echoed, so the event still parses with the SDK (CONF-1)."""
    if isinstance(raw, str):
        return raw
    try:
        items = parse_input(raw)
    except ProtocolError:
        return []
    if all(isinstance(i, Message) and i.role == "user" for i in items):
        return items
    return ""
