"""Each sampling step's training fields on its last item (SPEC: TOK-60, TOK-61).

With ``include: ["output[*].token_ids"]`` or the route's ``training_fields``, on a backend that
renders the model's own tokens, the last item a sampling step writes (message, reasoning,
function or custom tool call) carries ``prompt_token_ids`` (the step's whole prompt),
``generation_token_ids`` and ``generation_log_probs``: NeMo Gym's names, read off the rollout's
trajectory (never from a backend) when the step ends, however it ends.

Which item is last is known only then, so while a step runs the latest
``response.output_item.done`` is held (``HeldDone``) until the next event: that event shows it
was not the last, and it leaves first, so the order is kept. At the step's end the held item
gets the fields and leaves. An item the step cut open (``max_output_tokens``, a cancel) gets
them when the response ends (``settle``), in the terminal event and the stored response.
"""

from __future__ import annotations

import msgspec

from engine.conversation.trajectory import StepFields
from engine.rollout.turn import Turn
from protocol import events as ev
from protocol.events import Sink
from protocol.items import OutputItem, TrainableItem
from protocol.stream import keep_open_item


class HeldDone:
    """The step's sink: the latest ``output_item.done`` waits for the next event."""

    def __init__(self, inner: Sink) -> None:
        self.inner = inner
        self.held: ev.OutputItemDone | None = None

    async def send(self, event: ev.ServerEvent) -> None:
        held, self.held = self.held, None
        if held is not None:
            await self.inner.send(held)
        if isinstance(event, ev.OutputItemDone):
            self.held = event
        else:
            await self.inner.send(event)

    async def flush(self) -> None:
        held, self.held = self.held, None
        if held is not None:
            await self.inner.send(held)


def with_fields(item: TrainableItem, fields: StepFields) -> TrainableItem:
    return msgspec.structs.replace(
        item,
        prompt_token_ids=fields.prompt,
        generation_token_ids=fields.ids,
        generation_log_probs=fields.logprobs,
    )


def attach(output: list[OutputItem], first: int, fields: StepFields) -> int | None:
    """The fields on the last item the model wrote at ``first`` or after; its index."""
    for index in range(len(output) - 1, first - 1, -1):
        item = output[index]
        if isinstance(item, TrainableItem):
            output[index] = with_fields(item, fields)
            return index
    return None


def step_ended(turn: Turn, first: int, fields: StepFields | None, held: HeldDone | None) -> None:
    """The step is over: its fields join its last item now, or, with an item still open (cut by
    the output limit or a cancel), when the response ends (``settle``)."""
    if fields is None:
        return
    stream = turn.stream
    if stream.has_open_item:
        turn.training = (first, fields)
        return
    index = attach(stream.output, first, fields)
    waiting = held.held if held is not None else None
    if index is not None and waiting is not None and waiting.output_index == index:
        waiting.item = stream.output[index]


def settle(turn: Turn, event: ev.ServerEvent | None = None, *, keep_open: bool = False) -> None:
    """The fields a cut-open item is owed, on it once the response's end closed it (ORD-8):
    in the response and in its terminal event (a copy of the output list). ``keep_open``: a
    cancel, which otherwise drops the open item, keeps it (``incomplete``) to carry them."""
    owed, turn.training = turn.training, None
    if owed is None:
        return
    first, fields = owed
    if keep_open:
        keep_open_item(turn.stream)
    output = turn.stream.output
    index = attach(output, first, fields)
    response = getattr(event, "response", None)
    if index is not None and response is not None and len(response.output) > index:
        response.output[index] = output[index]
