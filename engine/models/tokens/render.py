"""Items -> the model's prompt ids, rendered once and appended (SPEC: TOK-3, TOK-4).

``Renderer`` is what every prompt format shares, written once: the first turn of a trajectory
(or any turn after its header changed, or a ``rerender`` route's every turn) renders the whole
conversation; every later turn renders only the items that joined the context since the model's
last answer and appends their ids. The sampled ids themselves are never re-rendered: that is
what keeps a prompt token-exact. A format is a subclass in its own module (``jinja.py``: the
model's chat template; ``harmony.py``: gpt-oss's encoding) and one line in ``RENDERERS``,
named by the route's ``template``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from engine.conversation.context import Context
from engine.conversation.trajectory import Trajectory, header_digest
from engine.models.tokens.registry import Registry
from engine.models.tokens.tokenizer import ModelTokenizer
from engine.models.upstreams.chat_wire import functions_for
from protocol.items import InputItem
from protocol.tools import Toolset

Header = TypeVar("Header")  # the tools as the format describes them


@dataclass
class Rendered:
    trajectory: Trajectory
    fresh: int  # ids rendered for this prompt
    full: bool  # the whole conversation was rendered (first turn, or a re-render)


@dataclass
class SampledAnswer:
    """What one generation leaves for the trajectory: its ids exactly, and where it stands in
    the context (its first item, and the items up to its last)."""

    ids: list[int]
    logprobs: list[float | None]
    answer_from: int  # the context index of the answer's first item
    covered: int  # context items the trajectory stands for once the answer joined
    ended_in_call: bool = False
    finish: str = "stop"  # why the sample ended (TOK-43): stop, tool or length


def needs_full_render(trajectory: Trajectory | None, digest: str, items: int) -> bool:
    """No trajectory to continue: none yet, its last prompt's answer never joined, the
    instructions or tools changed, or the context was replaced (compaction) (TOK-4)."""
    return (
        trajectory is None
        or trajectory.open
        or trajectory.header != digest
        or trajectory.covered > items
    )


class Renderer(ABC, Generic[Header]):
    """A prompt format: the whole conversation, the ids of new items, and the close owed after
    a sampled answer (TOK-3, TOK-4)."""

    # The reasoning parser the format implies when the route names none (harmony's channels).
    reasoning: ClassVar[str | None] = None
    # The route must name a tokenizer (a format with its own encoding must not).
    needs_tokenizer: ClassVar[bool] = True

    def __init__(self, rerender: bool = False) -> None:
        self.rerender = rerender
        self.stats: Counter[str] = Counter()
        self._header_cache: tuple[Toolset, str | None, Header, str] | None = None

    @classmethod
    @abstractmethod
    def build(cls, tokenizer: ModelTokenizer | None, rerender: bool) -> Renderer[Any]:
        """The renderer of a route (its tokenizer, when the format needs one)."""

    def prompt(self, ctx: Context, tools: Toolset, trajectory: Trajectory | None) -> Rendered:
        instructions = ctx.header_key[0] if ctx.header_key is not None else None
        header, digest = self._header(instructions, tools)
        items = ctx.items
        if self.rerender or needs_full_render(trajectory, digest, len(items)):
            if trajectory is not None and not self.rerender:
                self.stats["rerender.stale"] += 1  # instructions/tools changed, or compaction
            trajectory = Trajectory(digest)
            trajectory.given(self.whole(items, instructions, header))
            trajectory.covered = len(items)
            trajectory.prompt = len(trajectory)
            trajectory.open = True
            self.stats["render.full"] += 1
            return Rendered(trajectory, len(trajectory), full=True)
        assert trajectory is not None
        ids = self.appended(items, trajectory)
        trajectory.prompted(ids, len(items))
        self.stats["render.incremental"] += 1
        return Rendered(trajectory, len(ids), full=False)

    def _header(self, instructions: str | None, tools: Toolset) -> tuple[Header, str]:
        """The tools as the format describes them and the header's digest; a continuation
        resends equal tools and instructions (compared by their bytes, TOOL-1), so both are
        computed once."""
        cached = self._header_cache
        if cached is not None and cached[0] == tools and cached[1] == instructions:
            return cached[2], cached[3]
        defs = functions_for(tools, Counter())
        header, digest = self.describe(defs), header_digest(self.header_text(instructions, defs))
        self._header_cache = (tools, instructions, header, digest)
        return header, digest

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Ids below it are the model's; a carried id at or above it is refused (TOK-63)."""

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """The format's text -> ids, its special tokens read as such."""

    @abstractmethod
    def describe(self, defs: list[dict[str, Any]]) -> Header:
        """The function tools (chat completions shape) as the format renders them."""

    @abstractmethod
    def header_text(self, instructions: str | None, defs: list[dict[str, Any]]) -> str:
        """What the header's digest is taken of: a change re-renders the whole (TOK-4)."""

    @abstractmethod
    def whole(self, items: list[InputItem], instructions: str | None, header: Header) -> list[int]:
        """The whole conversation's ids and the generation prompt."""

    @abstractmethod
    def appended(self, items: list[InputItem], trajectory: Trajectory) -> list[int]:
        """The ids of ``items[trajectory.covered:]`` and the generation prompt, after the
        close the last answer owes (``trajectory.tail``)."""

    def join(self, trajectory: Trajectory, answer: SampledAnswer) -> None:
        """The sampled ids join the trajectory exactly; the format's close is owed."""
        trajectory.sampled_ids(answer.ids, answer.logprobs, answer.finish)
        trajectory.tail = self.close(answer)
        trajectory.covered = answer.covered
        trajectory.answer_from = -1
        self.joined(trajectory, answer)
        trajectory.open = False

    @abstractmethod
    def close(self, answer: SampledAnswer) -> str:
        """The text that closes the sampled answer, when the model did not sample it."""

    def joined(self, trajectory: Trajectory, answer: SampledAnswer) -> None:
        """What the format keeps of the answer to check its re-render later (none here)."""
        return None


# the route's ``template`` -> its renderer (HARMONY-1)
RENDERERS: Registry[Renderer[Any]] = Registry(
    Renderer,
    {
        "jinja": "engine.models.tokens.jinja:JinjaRenderer",
        "harmony": "engine.models.tokens.harmony:HarmonyRenderer",
    },
)
