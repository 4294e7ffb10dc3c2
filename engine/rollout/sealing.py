"""Sealing reasoning items as a step closes them (SPEC: SEAL-1, SEAL-3).

With ``include: ["reasoning.encrypted_content"]`` every reasoning item that completes carries a
blob sealed for the requester (``engine/conversation/sealed.py``). On a backend that renders the
model's own tokens, the step's first reasoning item also carries the exact ids of the whole
sampled run and how many items the run made, which are known only when the step finishes: the
step's deltas after that item are held until its ``Finish`` (at most the step's own output,
bounded by ``max_output_tokens``), then the item closes sealed and the held deltas follow in
order. Reasoning text still streams as it is sampled.
"""

from __future__ import annotations

from engine.conversation.sealed import KeyRing, SealedReasoning
from engine.models.base import CallStart, Delta, Finish, ReasoningDelta, TextDelta
from protocol.stream import ResponseStream


class StepSeal:
    """One sampling step's sealing: which deltas wait, and each reasoning item's blob."""

    def __init__(
        self, keys: KeyRing, owner: str | None, model: str, exact: bool, first_new: int
    ) -> None:
        self._keys = keys
        self._owner = owner
        self._model = model
        self._exact = exact  # the backend renders its own tokens: the run's ids are sealed
        self._first_new = first_new  # the step's first output index
        self._lead = 0
        self.held: list[Delta] | None = None

    def hold(self, stream: ResponseStream, delta: Delta) -> bool:
        """Whether ``delta`` waits for the step's end (the run's ids are not known yet)."""
        if self.held is not None:
            self.held.append(delta)
            return True
        if self._exact and stream.reasoning_open and not isinstance(delta, ReasoningDelta):
            self._lead = len(stream.output) - self._first_new  # the run's items before it
            self.held = [delta]
            return True
        return False

    def cut_in_reasoning(self, finish: Finish) -> bool:
        """The output limit cut the reasoning item itself: nothing followed it."""
        return finish.reason == "length" and self.held is not None and len(self.held) == 1

    def release(self) -> list[Delta]:
        held, self.held, self._exact = self.held or [], None, False  # one run per step
        return held

    def blob(self, stream: ResponseStream, finish: Finish | None = None) -> str | None:
        """The open reasoning item's sealed blob; ``finish`` (the step's end, while deltas
        are held) adds the run's ids when the run ended whole (stop or tool calls)."""
        found = stream.open_reasoning()
        if found is None:
            return None
        item_id, text = found
        content = SealedReasoning(text=text, model=self._model)
        tokens = finish.tokens if finish is not None else None
        if tokens is not None and finish is not None and finish.reason in ("stop", "tool_calls"):
            content.ids = tokens.sampled
            content.lead = self._lead
            content.items = 1 + _items(self.held or [])
        return self._keys.seal(content, self._owner, item_id)


def _items(deltas: list[Delta]) -> int:
    """The output items ``deltas`` open: a message per run of text, a reasoning item per run
    of reasoning, one per call."""
    count, kind = 0, None
    for delta in deltas:
        if isinstance(delta, TextDelta | ReasoningDelta):
            if kind is not type(delta):
                count += 1
                kind = type(delta)
        elif isinstance(delta, CallStart):
            count += 1
            kind = None
    return count
