"""A stateless continuation from the ids a client carried back (SPEC: TOK-62, TOK-63).

The client resent its whole history with the training fields of each sampling step on the
step's last item (``Context.carried``, ``engine/conversation/carried.py``). The trajectory is
rebuilt as the live rollout built it, each step checked against what it carries:

- every carried id is in the route's vocabulary;
- the prompt the engine renders for the items before the run (the first prompt whole, each
  later one the previous prompt, the previous run's ids exactly, the template's close and the
  items between as a delta, TOK-4) is the step's ``prompt_token_ids``, id for id: prompts from
  another route's tokenizer or template, or for items the client changed since, differ;
- the route's own parsers read the step's ``generation_token_ids`` into the run's items
  (reasoning text, message text, each call's name and arguments), exactly: ids of another
  tokenizer, or items edited after sampling, read otherwise.

Then the run's ids join exactly as sampled, with the logprobs carried. Anything else is a 400
``invalid_value`` naming ``input[i].<field>`` (TOK-63), raised at pre-inference: nothing of the
request runs, and nothing is ever rendered silently in place of what was carried.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.conversation.carried import CarriedRun, refused
from engine.conversation.context import Context
from engine.conversation.trajectory import Trajectory
from engine.models.base import ArgsDelta, CallStart, Delta, ReasoningDelta, TextDelta
from engine.models.tokens.reasoning import ReasoningParser
from engine.models.tokens.render import Renderer, SampledAnswer
from engine.models.tokens.tool_parsers import ToolSchemas
from engine.models.upstreams.chat import _with_namespace
from protocol.items import (
    CustomToolCall,
    FunctionCall,
    InputItem,
    Message,
    Reasoning,
    reasoning_text,
    text_of,
)
from protocol.tools import Toolset

Read = tuple[str, str]  # (kind, what the model wrote): reasoning, message, call


def continued(
    renderer: Renderer[Any], reading: ReasoningParser, ctx: Context, tools: Toolset
) -> Trajectory | None:
    """The trajectory rebuilt from the context's carried runs, or None when none applies (a
    trajectory to continue already, a re-rendering route, no run carried). The runs are used
    once. Raises ``InvalidRequest`` (TOK-63)."""
    runs, ctx.carried = ctx.carried, None
    if not runs or ctx.model_tokens is not None or renderer.rerender:
        return None
    vocab = renderer.vocab_size
    schemas: ToolSchemas = {t.name: t.parameters for t in tools.callables if t.parameters}
    trajectory: Trajectory | None = None
    for start in sorted(runs):
        run = runs[start]
        _in_vocabulary(run, vocab)
        view = Context(items=ctx.items[:start], header_key=ctx.header_key)
        trajectory = renderer.prompt(view, tools, trajectory).trajectory
        if not _same(trajectory, run.prompt):
            raise refused(
                run.at, "prompt_token_ids", "not this route's prompt for the items before it"
            )
        items = ctx.items[start : start + run.items]
        wrote, ended_in_call = _read(reading, schemas, tools, run.ids)
        if wrote != _written(items):
            raise refused(run.at, "generation_token_ids", "they do not read as the items")
        finish = _finish(items)
        answer = SampledAnswer(
            run.ids, list(run.logprobs), -1, start + run.items, ended_in_call, finish
        )
        renderer.join(trajectory, answer)  # a cut run (no end id) owes the whole close
    renderer.stats["render.carried"] += 1
    return trajectory


def _in_vocabulary(run: CarriedRun, vocab: int) -> None:
    for name, ids in (("prompt_token_ids", run.prompt), ("generation_token_ids", run.ids)):
        if max(ids) >= vocab:
            raise refused(run.at, name, f"an id outside the route's vocabulary ({vocab})")


def _same(trajectory: Trajectory, prompt: list[int]) -> bool:
    ids = trajectory.ids.view()
    return len(ids) == len(prompt) and bool(np.array_equal(ids, np.asarray(prompt)))


def _read(
    reading: ReasoningParser, schemas: ToolSchemas, tools: Toolset, ids: list[int]
) -> tuple[list[Read], bool]:
    """What the route's parsers read in the sampled ids, item by item, as in a live step."""
    reader = reading.reader(schemas)
    deltas = [*reader.feed(ids), *reader.finish()]
    return _items_of([_with_namespace(d, tools) for d in deltas]), reader.ended_in_call


def _items_of(deltas: list[Delta]) -> list[Read]:
    out: list[Read] = []
    open_kind: str | None = None
    for delta in deltas:
        if isinstance(delta, TextDelta | ReasoningDelta):
            kind = "message" if isinstance(delta, TextDelta) else "reasoning"
            if open_kind != kind:
                out.append((kind, ""))
                open_kind = kind
            out[-1] = (kind, out[-1][1] + delta.text)
        elif isinstance(delta, CallStart):
            out.append(("call", f"{delta.namespace or ''}\x00{delta.name}\x00"))
            open_kind = None
        elif isinstance(delta, ArgsDelta) and out and out[-1][0] == "call":
            out[-1] = ("call", out[-1][1] + delta.text)
        else:
            open_kind = None
    return out


def _written(items: list[InputItem]) -> list[Read]:
    out: list[Read] = []
    for item in items:
        if isinstance(item, Reasoning):
            out.append(("reasoning", reasoning_text(item)))
        elif isinstance(item, Message):
            out.append(("message", text_of(item.content)))
        elif isinstance(item, FunctionCall):
            out.append(("call", f"{item.namespace or ''}\x00{item.name}\x00{item.arguments}"))
        elif isinstance(item, CustomToolCall):
            out.append(("call", f"{item.namespace or ''}\x00{item.name}\x00{item.input}"))
    return out


def _finish(items: list[InputItem]) -> str:
    """Why the run ended, as the trajectory records it (TOK-43)."""
    last = items[-1] if items else None
    if getattr(last, "status", None) == "incomplete":
        return "length"
    return "tool" if any(isinstance(i, FunctionCall | CustomToolCall) for i in items) else "stop"
