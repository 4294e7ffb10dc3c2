"""UP-RESP-6: a Responses upstream's ``input`` is built from each item's JSON, encoded once per
item and kept on the context (charged like the items, MEM-10), with the very bytes the
per-step mapping of UP-RESP-1 gives."""

from __future__ import annotations

from collections import Counter
from typing import Any

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from engine.conversation.context import Context
from engine.models.upstreams.responses_wire import ENGINE_MCP_ITEMS, compaction_input, input_items
from protocol.codec import parse_input
from protocol.items import Compaction, OpaqueItem, Reasoning

TEXT = st.text(st.characters(codec="utf-8"), max_size=40)
ID = st.text("abcdef0123456789", min_size=1, max_size=8)


def _item(kind: str, text: str, ident: str) -> dict[str, Any]:
    if kind == "user":
        return {"type": "message", "role": "user", "content": text, "id": f"msg_{ident}"}
    if kind == "assistant":
        content = [{"type": "output_text", "text": text, "annotations": []}]
        return {"type": "message", "role": "assistant", "content": content, "status": "completed"}
    if kind == "call":
        return {"type": "function_call", "call_id": f"c{ident}", "name": "f", "arguments": text,
                "id": f"fc_{ident}", "status": "completed"}  # fmt: skip
    if kind == "output":
        return {"type": "function_call_output", "call_id": f"c{ident}", "output": text}
    if kind == "reasoning":
        return {"type": "reasoning", "id": f"rs_{ident}",
                "summary": [{"type": "summary_text", "text": text}]}  # fmt: skip
    if kind == "mcp_list_tools":
        return {"type": "mcp_list_tools", "id": f"mcpl_{ident}", "server_label": "s", "tools": []}
    return {"type": "shell_call", "id": f"sh_{ident}", "call_id": f"c{ident}", "action": text}


ITEMS = st.lists(
    st.builds(
        _item,
        st.sampled_from(
            ["user", "assistant", "call", "output", "reasoning", "mcp_list_tools", "shell"]
        ),
        TEXT,
        ID,
    ),
    max_size=12,
)


def reference(items: list[Any], pass_reasoning: bool) -> tuple[bytes, Counter[str]]:
    """UP-RESP-1 in this test's own words: every item built afresh for the step, our ids and
    statuses stripped, reasoning only when passed, the engine's MCP bookkeeping never."""
    out: list[Any] = []
    dropped: Counter[str] = Counter()
    for item in items:
        if isinstance(item, OpaqueItem):
            if item.type in ENGINE_MCP_ITEMS:
                dropped[item.type] += 1
            else:
                out.append(item.data)
        elif isinstance(item, Reasoning):
            if pass_reasoning:
                out.append(msgspec.to_builtins(item))
            else:
                dropped["reasoning"] += 1
        elif isinstance(item, Compaction):
            out.append(compaction_input(item))
        else:
            out.append(msgspec.to_builtins(msgspec.structs.replace(item, id=None, status=None)))
    return msgspec.json.encode({"input": out}), dropped


@given(ITEMS, ITEMS, st.booleans())
def test_the_kept_entries_are_the_bytes_of_a_fresh_mapping(
    first: list[Any], then: list[Any], pass_reasoning: bool
) -> None:
    ctx = Context()
    for batch in (first, then):  # two steps: the second resends the first's items
        ctx.items.extend(parse_input(batch))
        dropped: Counter[str] = Counter()
        sent = msgspec.json.encode({"input": input_items(ctx, 0, pass_reasoning, dropped)})
        assert (sent, dropped) == reference(ctx.items, pass_reasoning)
    start = len(parse_input(first))  # a continuation by id sends only the newer items
    dropped = Counter()
    sent = msgspec.json.encode({"input": input_items(ctx, start, pass_reasoning, dropped)})
    assert (sent, dropped) == reference(ctx.items[start:], pass_reasoning)


def test_a_step_encodes_only_the_items_it_has_not_sent_before() -> None:
    ctx = Context()
    ctx.items.extend(parse_input([_item("user", "hello", "1"), _item("call", "{}", "2")]))
    first = input_items(ctx, 0, False, Counter())
    ctx.items.extend(parse_input([_item("output", "x" * 1500, "2")]))
    second = input_items(ctx, 0, False, Counter())
    assert len(second) == 3
    assert all(a is b for a, b in zip(first, second, strict=False))  # the history as kept
    assert ctx.wire is not None and len(ctx.wire.entries) == ctx.wire.covered == len(ctx.items)
    # another mapping (a route that passes reasoning) builds its own entries from the start
    third = input_items(ctx, 0, True, Counter())
    assert bytes(third[0]) == bytes(second[0]) and third[0] is not second[0]


def test_the_kept_entries_are_charged_to_the_context() -> None:
    ctx = Context()
    before = ctx.retained_bytes
    ctx.items.extend(parse_input([_item("output", "y" * 4000, "1")]))
    input_items(ctx, 0, False, Counter())
    assert ctx.retained_bytes - before >= 4000  # the JSON held for the upstream (MEM-10)
    assert ctx.fork().retained_bytes == ctx.retained_bytes
