"""A stateless continuation rendered from sealed runs (SPEC: SEAL-4, TOK-4).

The client sent the whole conversation again, with the sealed reasoning of earlier turns
(``Context.sealed``: each run's exact sampled ids, by the index of its first item). The
trajectory is rebuilt as the live rollout built it: the first prompt renders the items before
the first run, then each run's ids join exactly as sampled (the template's close owed after
them), then the items up to the next run render as a delta, and so on; the last delta ends
with the generation prompt. So every prompt is the previous prompt plus the ids the model
sampled, with no store and on any node holding the key.
"""

from __future__ import annotations

from typing import Any

from engine.conversation.context import Context
from engine.conversation.sealed import SealedRun
from engine.conversation.trajectory import Trajectory
from engine.models.tokens.render import Rendered, Renderer, SampledAnswer
from protocol.items import CustomToolCall, FunctionCall, InputItem, Message, Reasoning
from protocol.tools import Toolset

_MODEL_ITEMS = (Reasoning, FunctionCall, CustomToolCall)


def replayed(renderer: Renderer[Any], ctx: Context, tools: Toolset, model: str) -> Rendered | None:
    """The prompt rebuilt from the context's sealed runs, or None when none applies (a live
    trajectory, a re-rendering route, no run that fits the items). The runs are used once."""
    runs, ctx.sealed = ctx.sealed, {}
    if ctx.model_tokens is not None or renderer.rerender:
        return None
    usable = _fitting(ctx.items, runs, model)
    if not usable:
        return None
    trajectory: Trajectory | None = None
    for start, run in usable:
        view = Context(items=ctx.items[:start], header_key=ctx.header_key)
        trajectory = renderer.prompt(view, tools, trajectory).trajectory
        answer = SampledAnswer(
            run.ids,
            [None] * len(run.ids),
            -1,
            start + run.items,
            finish=_finish(ctx.items, start, run),
        )
        renderer.join(trajectory, answer)
    rendered = renderer.prompt(ctx, tools, trajectory)
    renderer.stats["render.sealed"] += 1
    return Rendered(rendered.trajectory, len(rendered.trajectory), full=True)


def _fitting(
    items: list[InputItem], runs: dict[int, SealedRun], model: str
) -> list[tuple[int, SealedRun]]:
    """The runs, in order, that stand for model output in these items: sampled by this route,
    not overlapping, every item they cover one the model makes (reasoning, an assistant
    message, a call). A run that does not fit is left to the template."""
    out: list[tuple[int, SealedRun]] = []
    end = 0
    for start in sorted(runs):
        run = runs[start]
        stop = start + run.items
        if run.model != model or start < end or stop > len(items) or run.items < 1:
            continue
        if all(_made_by_model(item) for item in items[start:stop]):
            out.append((start, run))
            end = stop
    return out


def _made_by_model(item: InputItem) -> bool:
    if isinstance(item, Message):
        return item.role == "assistant"
    return isinstance(item, _MODEL_ITEMS)


def _finish(items: list[InputItem], start: int, run: SealedRun) -> str:
    """Why the run ended, as the trajectory records it (TOK-43): ``tool`` when it called."""
    covered = items[start : start + run.items]
    return (
        "tool"
        if any(isinstance(item, FunctionCall | CustomToolCall) for item in covered)
        else "stop"
    )
