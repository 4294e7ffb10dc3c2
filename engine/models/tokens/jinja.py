"""The model's own chat template (``template = "jinja"``, SPEC: TOK-3, TOK-4).

The first turn renders the conversation with the chat template (instructions and tools
included) and the generation prompt. Every later turn renders only the new items as a *delta*:
the template's rendering of ``[previous message] + new`` minus its rendering of
``[previous message]`` (the previous message is there because templates look one message back,
e.g. to group tool results), after the template text that closes the model's sampled answer
(``tail``).

``rerender`` (the route's ``history = "rerender"``) renders the whole conversation every turn
instead, as a chat server would: for templates whose rendering of the history is meant to
change (it drops earlier thinking, say) and a model trained on that.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections import Counter
from typing import Any

from engine.conversation.trajectory import Trajectory
from engine.models.tokens.render import Renderer, SampledAnswer
from engine.models.tokens.tokenizer import Message, ModelTokenizer
from engine.models.upstreams.chat_wire import ChatOptions, messages_for
from protocol.items import InputItem

log = logging.getLogger("rollout.upstream.tokens")

_OPTIONS = ChatOptions(reasoning_field="reasoning_content")  # what templates read (REASON-4)
_LOOK_BACK = 8  # items read to rebuild the message before a delta (a call group fits)


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


class JinjaRenderer(Renderer[list[dict[str, Any]]]):
    def __init__(self, tokenizer: ModelTokenizer, rerender: bool = False) -> None:
        super().__init__(rerender)
        self.tokenizer = tokenizer

    @classmethod
    def build(cls, tokenizer: ModelTokenizer | None, rerender: bool) -> JinjaRenderer:
        assert tokenizer is not None  # the route's config requires one (CFG-1)
        if not tokenizer.shape.append_only:
            log.warning("the chat template is not append-only: exact tokens are kept (TOK-4)")
        return cls(tokenizer, rerender)

    @property
    def vocab_size(self) -> int:
        size: int = self.tokenizer.tokenizer.get_vocab_size(with_added_tokens=True)
        return size

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def describe(self, defs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return defs

    def header_text(self, instructions: str | None, defs: list[dict[str, Any]]) -> str:
        return f"{instructions or ''}\x00{json.dumps(defs, sort_keys=True)}"

    def whole(
        self, items: list[InputItem], instructions: str | None, header: list[dict[str, Any]]
    ) -> list[int]:
        messages = template_messages(items, instructions)
        return self.encode(self.tokenizer.template.render(messages, header, True))

    def appended(self, items: list[InputItem], trajectory: Trajectory) -> list[int]:
        if trajectory.answer_from >= 0:
            answered = items[: trajectory.covered]
            self.check_answer(answered, trajectory.answer_from, trajectory.answer_text)
            trajectory.answer_from = -1
        return self.encode(trajectory.tail + self._delta(items, trajectory.covered))

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

    def close(self, answer: SampledAnswer) -> str:
        """The template's close, less what the model sampled of it (its end token)."""
        tokenizer = self.tokenizer
        close = tokenizer.shape.close
        if answer.ids and answer.ids[-1] in tokenizer.end_ids:
            last = tokenizer.decode(answer.ids[-1:])
            at = close.find(last)
            return close[at + len(last) :] if at >= 0 else ""
        return close

    def joined(self, trajectory: Trajectory, answer: SampledAnswer) -> None:
        """The answer as sampled, to check the template renders it so next turn (TOK-4)."""
        trajectory.answer_from = answer.answer_from
        sampled = self.tokenizer.decode(answer.ids)
        shape = self.tokenizer.shape
        trajectory.answer_text = shape.generation_prompt + sampled + trajectory.tail

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
