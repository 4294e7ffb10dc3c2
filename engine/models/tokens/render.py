"""Items -> the model's prompt ids, rendered once and appended (SPEC: TOK-3, TOK-4).

The first turn of a trajectory renders the conversation with the chat template (instructions
and tools included) and the generation prompt. Every later turn renders only the items that
joined the context since the model's last answer, as a *delta*: the template's rendering of
``[previous message] + new`` minus its rendering of ``[previous message]`` (the previous
message is there because templates look one message back, e.g. to group tool results), after
the template text that closes the model's sampled answer (``tail``). The sampled ids themselves
are never re-rendered: that is what keeps a prompt token-exact.

``rerender`` (the route's ``history = "rerender"``) renders the whole conversation every turn
instead, as a chat server would: for templates whose rendering of the history is meant to
change (it drops earlier thinking, say) and a model trained on that.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

from engine.conversation.context import Context
from engine.conversation.trajectory import Trajectory, header_digest
from engine.models.tokens.tokenizer import Message, ModelTokenizer
from engine.models.upstreams.chat_wire import ChatOptions, functions_for, messages_for
from protocol.items import InputItem
from protocol.tools import Toolset

_OPTIONS = ChatOptions(reasoning_field="reasoning_content")  # what templates read (REASON-4)
_LOOK_BACK = 8  # items read to rebuild the message before a delta (a call group fits)


@dataclass
class Rendered:
    trajectory: Trajectory
    fresh: int  # ids rendered for this prompt
    full: bool  # the whole conversation was rendered (first turn, or a re-render)


def template_messages(items: list[InputItem], instructions: str | None) -> list[Message]:
    """The chat messages the template reads (the ``chat`` mapping, UP-CHAT-2), with tool-call
    arguments as objects, the way vLLM hands them to a template."""
    messages = messages_for(items, instructions, _OPTIONS, Counter())
    for message in messages:
        for call in message.get("tool_calls", ()):
            function = call["function"]
            with contextlib.suppress(TypeError, ValueError):  # not JSON: the string stays
                function["arguments"] = json.loads(function["arguments"])
    return messages


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


class TurnRenderer:
    def __init__(self, tokenizer: ModelTokenizer, rerender: bool = False) -> None:
        self.tokenizer = tokenizer
        self.rerender = rerender
        self.stats: Counter[str] = Counter()
        self._header_cache: tuple[Toolset, str | None, list[dict[str, Any]], str] | None = None

    def _header(self, instructions: str | None, tools: Toolset) -> tuple[list[dict[str, Any]], str]:
        """The template's tools and the header's digest; a continuation resends equal tools
        and instructions (compared by their bytes, TOOL-1), so both are computed once."""
        cached = self._header_cache
        if cached is not None and cached[0] == tools and cached[1] == instructions:
            return cached[2], cached[3]
        defs = functions_for(tools, Counter())
        tools_json = json.dumps(defs, sort_keys=True)
        digest = header_digest(f"{instructions or ''}\x00{tools_json}")
        self._header_cache = (tools, instructions, defs, digest)
        return defs, digest

    def prompt(self, ctx: Context, tools: Toolset, trajectory: Trajectory | None) -> Rendered:
        instructions = ctx.header_key[0] if ctx.header_key is not None else None
        defs, digest = self._header(instructions, tools)
        items = ctx.items
        if self.rerender or needs_full_render(trajectory, digest, len(items)):
            if trajectory is not None and not self.rerender:
                self.stats["rerender.stale"] += 1  # instructions/tools changed, or compaction
            return self._full(items, instructions, defs, digest)
        assert trajectory is not None
        if trajectory.answer_from >= 0:
            answered = items[: trajectory.covered]
            self.check_answer(answered, trajectory.answer_from, trajectory.answer_text)
            trajectory.answer_from = -1
        text = trajectory.tail + self._delta(items, trajectory.covered)
        ids = self.tokenizer.encode(text)
        trajectory.prompted(ids, len(items))
        self.stats["render.incremental"] += 1
        return Rendered(trajectory, len(ids), full=False)

    def _full(
        self,
        items: list[InputItem],
        instructions: str | None,
        defs: list[dict[str, Any]],
        digest: str,
    ) -> Rendered:
        messages = template_messages(items, instructions)
        text = self.tokenizer.template.render(messages, defs, True)
        trajectory = Trajectory(digest)
        trajectory.given(self.tokenizer.encode(text))
        trajectory.covered = len(items)
        trajectory.prompt = len(trajectory)
        trajectory.open = True
        self.stats["render.full"] += 1
        return Rendered(trajectory, len(trajectory), full=True)

    def _delta(self, items: list[InputItem], covered: int) -> str:
        """The template text of ``items[covered:]`` and the generation prompt."""
        template = self.tokenizer.template
        new = template_messages(items[covered:], None)
        base = template_messages(items[max(covered - _LOOK_BACK, 0) : covered], None)[-1:]
        before = template.render(base, None, False)
        after = template.render(base + new, None, True)
        if after.startswith(before):
            return after[len(before) :]
        # The template rewrote what came before: the exact ids already sent are kept (TOK-4).
        self.stats["drift.render"] += 1
        same = next((n for n, (a, b) in enumerate(zip(before, after, strict=False)) if a != b), 0)
        return after[same:]

    def join(self, trajectory: Trajectory, answer: SampledAnswer) -> None:
        """The sampled ids join the trajectory exactly; the template's close is owed."""
        tokenizer = self.tokenizer
        trajectory.sampled_ids(answer.ids, answer.logprobs, answer.finish)
        close = tokenizer.shape.close
        tail = close
        if answer.ids and answer.ids[-1] in tokenizer.end_ids:
            last = tokenizer.decode(answer.ids[-1:])
            at = close.find(last)
            tail = close[at + len(last) :] if at >= 0 else ""
        trajectory.tail = tail
        trajectory.covered = answer.covered
        trajectory.answer_from = answer.answer_from
        sampled = tokenizer.decode(answer.ids)
        trajectory.answer_text = tokenizer.shape.generation_prompt + sampled + tail
        trajectory.open = False

    def check_answer(self, items: list[InputItem], start: int, sampled_text: str) -> bool:
        """Whether the template renders the model's answer (``items[start:]``) as the model
        sampled it (``sampled_text``: generation prompt, sampled text, the close); a False is
        a turn where re-rendering the history would drift from what was sampled (TOK-4)."""
        template = self.tokenizer.template
        base = template_messages(items[max(start - _LOOK_BACK, 0) : start], None)[-1:]
        opened = template.render(base, None, False)
        closed = template.render(base + template_messages(items[start:], None), None, False)
        same = closed == opened + sampled_text
        if not same:
            self.stats["drift.answer"] += 1
        return same
