"""Token ids a client carries back on its items (SPEC: TOK-62..TOK-64).

A client that keeps its own history (NeMo Gym's agents, any stateless loop) sends back the
output items it received, with the training fields the engine put on the last item of each
sampling step (TOK-60): that step's whole prompt, its sampled ids and their logprobs. The
pre-inference pipeline takes them off the items here (the context, the store's listing and
every upstream see the items without them) and keeps each as a ``CarriedRun`` in
``Context.carried``, under the index of the run's first item: the run is the carrier and the
model-made items right before it, back to the previous carrier or the last item the model did
not make. The ``tokens`` backend then continues from them (``models/tokens/carried.py``), or
refuses them naming the field (TOK-63).

What can be checked without the route is checked here: all three fields together, one logprob
per sampled id, no negative id, and the bound (TOK-64).
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol.errors import InvalidRequest
from protocol.items import (
    CustomToolCall,
    FunctionCall,
    InputItem,
    Message,
    Reasoning,
    carries_tokens,
    without_tokens,
)

# TOK-64: ids one list of one item may carry (each of ``prompt_token_ids`` and
# ``generation_token_ids``): far above any model's context, far below what would hurt.
MAX_CARRIED_IDS = 1 << 20


@dataclass(frozen=True, slots=True)
class CarriedRun:
    """One sampling step as the client carried it back: its whole prompt, its sampled ids and
    their logprobs; ``items``: the context items it stands for from its first; ``at``: the
    carrier's index in the request's input (for an error's ``param``)."""

    prompt: list[int]
    ids: list[int]
    logprobs: list[float | None]
    items: int
    at: int


def made_by_model(item: InputItem) -> bool:
    """An item a sampling step writes: reasoning, an assistant message, a call."""
    if isinstance(item, Message):
        return item.role == "assistant"
    return isinstance(item, (Reasoning, FunctionCall, CustomToolCall))


def refused(at: int, name: str, why: str, param: str = "input") -> InvalidRequest:
    """TOK-63's error: 400 ``invalid_value`` naming the item's field."""
    where = f"{param}[{at}].{name}"
    return InvalidRequest("invalid_value", f"Invalid value for '{where}': {why}.", where)


def take_carried(
    items: list[InputItem], base: int, param: str, runs: dict[int, CarriedRun] | None
) -> list[InputItem]:
    """``items`` without their training fields; with ``runs`` given, each carrier's run joins
    it under its first item's context index (``base`` + its index). Items the model does not
    write carry no run: their fields are dropped (TOK-62)."""
    if not any(map(carries_tokens, items)):
        return items  # the common case: one set lookup an item
    out = items
    start = 0  # the first item of the run being read
    for n, item in enumerate(items):
        if not made_by_model(item):
            start = n + 1
        if not carries_tokens(item):
            continue
        if out is items:
            out = list(items)
        out[n] = without_tokens(item)
        if runs is not None and made_by_model(item):
            assert isinstance(item, (Message, Reasoning, FunctionCall, CustomToolCall))
            runs[base + start] = _run(item, n, start, param)
        start = n + 1
    return out


def _run(
    item: Message | Reasoning | FunctionCall | CustomToolCall, n: int, start: int, param: str
) -> CarriedRun:
    prompt, ids, logprobs = (
        item.prompt_token_ids,
        item.generation_token_ids,
        item.generation_log_probs,
    )
    for name, value in (
        ("prompt_token_ids", prompt),
        ("generation_token_ids", ids),
        ("generation_log_probs", logprobs),
    ):
        if value is None:
            raise refused(n, name, "the three training fields travel together", param)
    assert prompt is not None and ids is not None and logprobs is not None
    for name, value in (("prompt_token_ids", prompt), ("generation_token_ids", ids)):
        if len(value) > MAX_CARRIED_IDS:
            raise refused(n, name, f"more than {MAX_CARRIED_IDS} ids", param)
        if not value:
            raise refused(n, name, "no ids", param)
        if min(value) < 0:
            raise refused(n, name, "a negative id", param)
    if len(logprobs) != len(ids):
        raise refused(n, "generation_log_probs", "one logprob per generated id", param)
    return CarriedRun(prompt, ids, logprobs, n - start + 1, n)
