"""A rollout's token trajectory in the model's own tokenizer (SPEC: TOK-4, TOK-7, TOK-8).

Every id the model has read or written, in order: rendered runs (given items, the generation
prompt, template text between turns) and sampled runs (what the model produced, exactly). The
next prompt is always this trajectory plus newly rendered text: the history is never rendered
again, so the prompt of every turn extends the previous prompt and its sampled ids exactly.

Each sampled run keeps why it ended (TOK-43): ``stop`` (an end of turn), ``tool`` (it called
tools), ``length`` (the output limit), ``cancelled`` (the engine stopped it: a cancel, the
client gone, the model timeout) or ``error`` (the model server failed mid-answer). A cut answer
(the last two) joins as sampled and is stored, but the next turn renders afresh (TOK-4).

Alongside the ids it keeps their JSON text (``"1,2,3"``), grown by appending, so a request body
costs a copy of the history's bytes but no per-id encoding.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import msgspec

from engine.conversation.tokens import TokenBuffer
from engine.store.trajectory import TokenSegment

_ENCODE = msgspec.json.Encoder().encode


def header_digest(text: str) -> str:
    return hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()


@dataclass(frozen=True, slots=True)
class StepFields:
    """One sampling step's training fields (TOK-60): its whole prompt, its sampled ids and
    their logprobs, as the item that ends the step carries them."""

    prompt: list[int]
    ids: list[int]
    logprobs: list[float | None]


class Trajectory:
    __slots__ = (
        "answer_from",
        "answer_text",
        "covered",
        "cut",
        "finishes",
        "header",
        "ids",
        "ids_json",
        "logprobs",
        "open",
        "prompt",
        "sampled",
        "stored",
        "tail",
    )

    def __init__(self, header: str = "") -> None:
        self.ids = TokenBuffer()
        self.ids_json = bytearray()
        self.sampled: list[int] = []  # flattened [begin, end) pairs
        self.logprobs: list[float | None] = []  # one per sampled id
        self.finishes: list[str] = []  # one per sampled run: why it ended (TOK-43)
        self.covered = 0  # context items these ids stand for
        self.tail = ""  # template text owed before the next rendered items
        self.header = header  # digest of the instructions/tools the first render used
        self.prompt = 0  # length of the last prompt sent
        self.stored = (0, 0, 0)  # (ids, sampled spans, logprobs) already in the store
        # A prompt was sent and its answer has not joined (the sample failed or was cut off):
        # the next turn renders the conversation afresh rather than guess where it stands.
        self.open = False
        # The open prompt's answer was cut short (cancelled, failed): its ids are kept and
        # stored, and the trajectory stays ``open`` so the next turn renders afresh.
        self.cut = False
        # The model's last answer: the index of its first item and its text as sampled (the
        # generation prompt and the template's close included), for the drift check (TOK-4).
        self.answer_from = -1
        self.answer_text = ""

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def retained_bytes(self) -> int:
        """What the trajectory occupies (MEM-10): ids at capacity, their JSON, the spans and
        logprobs (a list slot and a float object each)."""
        floats = 32 * len(self.logprobs)
        spans = 8 * len(self.sampled)  # small ints are mostly cached; a slot each
        return self.ids.capacity_bytes + len(self.ids_json) + spans + floats + 512

    def given(self, ids: list[int]) -> None:
        self._extend(ids)

    def prompted(self, ids: list[int], covered: int) -> None:
        """The new items' ids (after the owed ``tail``) end the next prompt, which now stands
        for the context's first ``covered`` items and awaits its answer (TOK-4)."""
        self._extend(ids)
        self.tail = ""
        self.covered = covered
        self.prompt = len(self)
        self.open = True

    def sampled_ids(
        self, ids: list[int], logprobs: list[float | None], finish: str = "stop"
    ) -> None:
        if not ids:
            return
        begin = len(self.ids)
        self._extend(ids)
        if self.sampled and self.sampled[-1] == begin:
            self.sampled[-1] = len(self.ids)  # one run, streamed in pieces
            self.finishes[-1:] = [finish]
        else:
            self.sampled.extend((begin, len(self.ids)))
            self.finishes.append(finish)
        self.logprobs.extend(logprobs)

    def cut_short(self, ids: list[int], logprobs: list[float | None], reason: str) -> None:
        """The open prompt's answer ended before its end (``cancelled`` or ``error``): what
        was sampled is kept and stored (TOK-43); the prompt stays open (the next turn renders
        afresh, TOK-4)."""
        if not self.open or self.cut or not ids:
            return
        self.sampled_ids(ids, logprobs, reason)
        self.cut = True

    def samples(self) -> list[tuple[int, int, str]]:
        """Each sampled run: ``[start, end)`` in the ids and why it ended (turn boundaries)."""
        pairs, finishes = self.sampled, self.finishes
        runs = len(pairs) // 2
        reasons = (
            finishes if len(finishes) == runs else ["stop"] * (runs - len(finishes)) + finishes
        )
        return [(pairs[2 * n], pairs[2 * n + 1], reasons[n]) for n in range(runs)]

    def last_step(self) -> StepFields | None:
        """The last prompt, the ids sampled for it and their logprobs (TOK-60), read off the
        trajectory whatever the ending (stop, tool, length, cut short); None when no id was
        sampled for the last prompt (a step that failed before its first)."""
        pairs = self.sampled
        if not pairs or pairs[-2] != self.prompt:
            return None
        begin, end = pairs[-2], pairs[-1]
        view = self.ids.view()
        logprobs = self.logprobs[len(self.logprobs) - (end - begin) :]
        return StepFields(view[:begin].tolist(), view[begin:end].tolist(), logprobs)

    def _extend(self, ids: list[int]) -> None:
        if not ids:
            return
        try:  # one C call (the same bytes as joining each id's ``str``)
            text = _ENCODE(ids)[1:-1]
        except TypeError:  # ids that are not Python ints (numpy's): the same text, by ``str``
            text = ",".join(map(str, ids)).encode()
        if self.ids_json:
            self.ids_json += b","
        self.ids_json += text
        self.ids.extend(ids)

    def all_ids(self) -> list[int]:
        ids: list[int] = self.ids.view().tolist()
        return ids

    def mask(self) -> list[bool]:
        """Per id: sampled by the model (True) or rendered from given input (False)."""
        out = [False] * len(self.ids)
        pairs = self.sampled
        for n in range(0, len(pairs), 2):
            out[pairs[n] : pairs[n + 1]] = [True] * (pairs[n + 1] - pairs[n])
        return out

    def fork(self) -> Trajectory:
        clone = Trajectory(self.header)
        clone.ids = self.ids.copy()
        clone.ids_json = bytearray(self.ids_json)
        clone.sampled = list(self.sampled)
        clone.logprobs = list(self.logprobs)
        clone.finishes, clone.cut = list(self.finishes), self.cut
        clone.covered, clone.tail, clone.prompt = self.covered, self.tail, self.prompt
        clone.stored, clone.open = self.stored, self.open
        clone.answer_from, clone.answer_text = self.answer_from, self.answer_text
        return clone

    # ------------------------------------------------------------------ the store (TOK-8)
    def segment(self, snapshot: bool) -> TokenSegment | None:
        """What a stored record holds: everything (a snapshot) or what followed the parent;
        None while a prompt is open with no answer (nothing consistent to store). A trajectory
        rendered afresh (nothing of it stored yet) is stored whole, from 0."""
        if self.open and not self.cut:
            return None
        ids_from, spans_from, lps_from = (0, 0, 0) if snapshot else self.stored
        view = self.ids.view()
        return TokenSegment(
            start=ids_from,
            ids=view[ids_from:].tolist(),
            sampled=self.sampled[spans_from:],
            logprobs=self.logprobs[lps_from:],
            finishes=self.finishes[spans_from // 2 :],
            cut=self.cut,
            covered=self.covered,
            tail=self.tail,
            header=self.header,
            prompt=self.prompt,
        )

    def mark_stored(self) -> None:
        self.stored = (len(self.ids), len(self.sampled), len(self.logprobs))

    @classmethod
    def from_segments(cls, segments: list[TokenSegment]) -> Trajectory:
        last = segments[-1]
        traj = cls(last.header)
        for part in segments:
            traj._extend(part.ids)
            pairs = part.sampled
            if traj.sampled and pairs and traj.sampled[-1] == pairs[0]:
                traj.sampled[-1] = pairs[1]  # a run split across two records
                pairs = pairs[2:]
            traj.sampled.extend(pairs)
            traj.logprobs.extend(part.logprobs)
            traj.finishes[len(traj.sampled) // 2 - len(part.finishes) :] = part.finishes
        traj.covered, traj.tail, traj.prompt = last.covered, last.tail, last.prompt
        traj.open = traj.cut = last.cut  # a cut answer: the next turn renders afresh (TOK-4)
        traj.mark_stored()
        return traj
