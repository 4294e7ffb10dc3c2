"""Running a compaction with a backend (SPEC: COMPACT-1..COMPACT-6): the backend's own
``compact`` when it has one (the Responses upstream forwards it, the chat upstream asks its model),
otherwise the documented digest of ``engine.conversation.compaction``."""

from __future__ import annotations

from engine.conversation.compaction import Window, digest, seal, split, window_items
from engine.conversation.context import Context
from engine.conversation.tokens import count
from engine.models.base import Backend, Finish, SampleRequest, TextDelta
from engine.models.base import Compacted as Compacted
from engine.models.base import CompactRequest as CompactRequest
from protocol.items import Compaction, InputText, Message
from protocol.stream import new_id
from protocol.tools import EMPTY_TOOLSET

SUMMARY_PROMPT = (
    "Summarise the conversation above for your own later use: the facts, decisions, tool "
    "results and open questions a continuation needs. Write plain text, no preamble."
)


def compacted_with(
    window: Window, summary: str, input_tokens: int, output_tokens: int
) -> Compacted:
    item = Compaction(id=new_id("cmp"), encrypted_content=seal(summary))
    return Compacted(window_items(window, item), item, input_tokens, output_tokens)


async def compact(backend: Backend, request: CompactRequest) -> Compacted:
    """Compact ``request.context`` with the backend's own compaction, else the digest."""
    own = await backend.compact(request)
    if own is not None:
        return own
    window = split(request.context.items, request.keep_round)
    summary = digest(window.replaced)
    return compacted_with(window, summary, request.context.prompt_tokens, count(summary))


async def summarise_with_model(backend: Backend, request: CompactRequest) -> Compacted:
    """A summary written by the backend's model (the chat upstream's ``compact``)."""
    window = split(request.context.items, request.keep_round)
    ask = Message(role="user", content=[InputText(text=SUMMARY_PROMPT)])
    scratch = Context(items=[*window.replaced, ask], header_key=request.context.header_key)
    sample = SampleRequest(
        model=request.model,
        context=scratch,
        tools=EMPTY_TOOLSET,
        tool_choice="none",
        parallel_tool_calls=False,
        max_output_tokens=None,
    )
    pieces: list[str] = []
    finish: Finish | None = None
    async for delta in backend.stream(sample):
        if isinstance(delta, TextDelta):
            pieces.append(delta.text)
        elif isinstance(delta, Finish):
            finish = delta
    summary = "".join(pieces).strip()
    prompt = request.context.prompt_tokens
    input_tokens = prompt if finish is None or finish.input_tokens is None else finish.input_tokens
    output_tokens = count(summary) if finish is None else finish.output_tokens
    return compacted_with(window, summary, input_tokens, output_tokens)
