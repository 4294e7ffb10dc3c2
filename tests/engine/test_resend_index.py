"""A resent history's matching (COMPAT-8, COMPAT-9), on the real decoder, pipeline and cache.

Items are decoded from JSON by the server's own decoder (``decode_create_body``,
``check_supported``), in the shapes the openai SDK sends them back; contexts are built by the
pre-inference pipeline and published to a real ``HydrationCache``. What matches and what
starts afresh is what COMPAT-8 lists; the index is per owner, bounded with the cache, and a
context that grew past its response is never served (COMPAT-9)."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from engine.conversation.context import Context
from engine.conversation.pipeline import FULL, Pipeline, StageStats
from engine.conversation.requests import check_supported
from engine.conversation.resend import Rolling, canonical, prefix_digests
from engine.models.sim.simulator import SimulatedModel
from engine.retained.hydration import HydrationCache
from protocol.codec import decode_create_body
from protocol.items import InputItem

SUPPORTS = frozenset({"text", "image"})
CALL = {
    "type": "function_call",
    "id": "fc_1",
    "call_id": "call_1",
    "name": "get_weather",
    "arguments": '{"city": "Paris"}',
    "status": "completed",
}
ANSWER = {
    "type": "message",
    "id": "msg_1",
    "role": "assistant",
    "status": "completed",
    "content": [{"type": "output_text", "text": "Sunny.", "annotations": [], "logprobs": []}],
}


def decoded(*items: dict[str, Any]) -> list[InputItem]:
    body = json.dumps({"model": "sim", "input": list(items)}).encode()
    parsed, _ = check_supported(decode_create_body(body), "http", 10_000, 10_000_000)
    return parsed


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    (x,) = decoded(a)
    (y,) = decoded(b)
    return canonical(x) == canonical(y)


def without(item: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in item.items() if k not in keys}


@pytest.mark.parametrize(
    "resent",
    [
        without(CALL, "id"),
        without(CALL, "status"),
        {**CALL, "status": None, "id": None},  # model_dump() without exclude_none
        {**CALL, "prompt_token_ids": [1], "generation_token_ids": [2]},
    ],
)
def test_what_is_dropped_still_matches(resent: dict[str, Any]) -> None:
    """COMPAT-8: ``id``, ``status`` and the training fields are not part of an item."""
    assert same(CALL, resent)


@pytest.mark.parametrize(
    "resent",
    [
        {"role": "assistant", "content": "Sunny."},  # a string for one text part
        {**ANSWER, "content": [{"type": "input_text", "text": "Sunny."}]},  # the part's kind
        {**ANSWER, "content": [{"type": "output_text", "text": "Sunny."}]},  # no annotations
        {"type": "message", "role": "assistant", "content": "Sunny.", "phase": None},
    ],
)
def test_the_sdk_shapes_of_a_message_match(resent: dict[str, Any]) -> None:
    """COMPAT-8: string content and one text part of it; input_text and output_text."""
    assert same(ANSWER, resent)


@pytest.mark.parametrize(
    "resent",
    [
        {**CALL, "arguments": '{"city":"Paris"}'},  # arguments byte for byte
        {**CALL, "call_id": "call_2"},
        {**CALL, "name": "get_time"},
        {**ANSWER, "role": "user", "content": [{"type": "input_text", "text": "Sunny."}]},
        {**ANSWER, "content": "Sunny!"},
        {
            **ANSWER,
            "content": [
                {"type": "output_text", "text": "Sunny"},
                {"type": "output_text", "text": "."},
            ],
        },
    ],
)
def test_what_the_model_reads_starts_afresh(resent: dict[str, Any]) -> None:
    """COMPAT-8: a call's arguments, call id or name, a message's role, text or parts."""
    original = CALL if resent["type"] == "function_call" else ANSWER
    assert not same(original, resent)


def context_of(items: list[InputItem]) -> Context:
    ctx = Context()
    Pipeline(StageStats()).apply(ctx, items, path=FULL, supports=SUPPORTS)
    ctx.resend = ctx.resend.over(ctx.items)
    return ctx


def history(n: int) -> list[InputItem]:
    return decoded(
        {"role": "user", "content": f"Weather {n}?"},
        CALL,
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
    )


def test_the_longest_list_of_the_owner_and_backend_matches() -> None:
    """COMPAT-7, COMPAT-9: the longest published list the input begins with, of the same
    owner and backend; another owner's identical list is not looked at."""
    backend = SimulatedModel(0)
    cache = HydrationCache(10_000_000, Counter())
    items = history(1)
    short, long = context_of(items[:2]), context_of(items)
    cache.publish("resp_short", short, backend, "alice", stored=False, resendable=True)
    cache.publish("resp_long", long, backend, "alice", stored=False, resendable=True)
    resend = [*items, *decoded({"role": "user", "content": "And tomorrow?"})]
    found = cache.resent("alice", resend, backend)
    assert found is not None and found[0].response_id == "resp_long" and found[1] == 3
    assert cache.resent("bob", resend, backend) is None
    assert cache.resent("alice", resend, SimulatedModel(0)) is None
    # a store: false response's id continues nothing (CACHE-2)
    assert cache.get("resp_long", "alice", SUPPORTS) is None


def test_a_context_that_moved_on_is_not_served() -> None:
    """COMPAT-9 (HYD-3): a published context that grew since (a continuation took it on)
    is dropped, never served for the list it no longer is."""
    backend = SimulatedModel(0)
    cache = HydrationCache(10_000_000, Counter())
    items = history(1)
    ctx = context_of(items)
    cache.publish("resp_1", ctx, backend, None, stored=False, resendable=True)
    ctx.items.append(decoded({"role": "user", "content": "more"})[0])
    assert cache.resent(None, items, backend) is None
    assert "resp_1" not in cache


def test_the_index_is_bounded_with_the_cache() -> None:
    """COMPAT-9 (HYD-2): the lists are the cache's entries, charged with it; an evicted
    entry's list no longer matches, and the cache stays within its bytes."""
    backend = SimulatedModel(0)
    first, second = context_of(history(1)), context_of(history(2))
    size = first.retained_bytes + 1_000
    cache = HydrationCache(size + size // 2, Counter())
    cache.publish("resp_1", first, backend, None, stored=False, resendable=True)
    cache.publish("resp_2", second, backend, None, stored=False, resendable=True)
    assert len(cache) == 1 and cache.nbytes <= cache.max_bytes
    assert cache.resent(None, history(1), backend) is None
    found = cache.resent(None, history(2), backend)
    assert found is not None and found[0].response_id == "resp_2"


def test_a_contexts_digest_grows_with_it() -> None:
    """COMPAT-7: a context's rolling digest over its items equals the digest of the same list
    sent at once, however many publications it grew through."""
    items = history(3)
    rolling = Rolling().over(items[:1]).over(items[:2]).over(items)
    assert rolling.digest == prefix_digests(items)[-1]
    assert rolling.covered == 3


def test_a_list_is_confirmed_item_for_item() -> None:
    """COMPAT-7, COMPAT-8: lists of one length that end with the same item are told apart by
    their earlier items (each is found by its own resend), and a resend whose earlier item
    differs from every published list's matches none of them."""
    backend = SimulatedModel(0)
    cache = HydrationCache(10_000_000, Counter())
    first, second = history(1), history(2)
    for name, items in (("resp_1", first), ("resp_2", second)):
        ctx = context_of(items)
        cache.publish(name, ctx, backend, None, stored=False, resendable=True)
    for name, items in (("resp_1", first), ("resp_2", second)):
        found = cache.resent(None, [*items, *decoded({"role": "user", "content": "?"})], backend)
        assert found is not None and found[0].response_id == name and found[1] == 3
    other = [*decoded({"role": "user", "content": "Weather 3?"}), *first[1:]]
    assert cache.resent(None, other, backend) is None
