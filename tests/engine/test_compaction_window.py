"""The compaction window, digest, seal and pruning as pure functions (COMPACT-2, COMPACT-4)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from engine.conversation.compaction import (
    digest,
    prune,
    seal,
    split,
    summary_text,
    unseal,
    window_items,
    worth_compacting,
)
from protocol.items import (
    Compaction,
    FunctionCall,
    FunctionCallOutput,
    InputItem,
    Message,
    Reasoning,
    SummaryText,
)

CMP = Compaction(id="cmp_x", encrypted_content=seal("earlier"))


def user(text: str) -> Message:
    return Message(role="user", content=text)


def assistant(text: str) -> Message:
    return Message(role="assistant", content=text)


def call(call_id: str) -> FunctionCall:
    return FunctionCall(call_id=call_id, name="get_weather", arguments='{"city":"Lima"}')


def output(call_id: str, text: str = "sunny") -> FunctionCallOutput:
    return FunctionCallOutput(call_id=call_id, output=text)


def test_window_keeps_client_messages_and_the_trailing_tool_round() -> None:
    """COMPACT-2: the compaction item takes the last replaced item's place."""
    items: list[InputItem] = [
        Message(role="developer", content="rules"),
        user("q1"),
        call("a"),
        output("a"),
        assistant("answer one"),
        user("q2"),
        call("b"),
        output("b"),
    ]
    window = split(items)
    assert window.replaced == items[2:5]
    assert window_items(window, CMP) == [items[0], items[1], CMP, items[5], items[6], items[7]]


def test_output_of_a_replaced_call_goes_with_it() -> None:
    items: list[InputItem] = [user("q"), call("a"), assistant("x"), output("a")]
    window = split(items)
    assert window.replaced == [items[1], items[2], items[3]]
    assert window_items(window, CMP) == [items[0], CMP]


def test_nothing_to_replace_puts_the_item_before_the_tool_round() -> None:
    items: list[InputItem] = [user("q"), call("a"), output("a")]
    window = split(items)
    assert window.replaced == []
    assert window_items(window, CMP) == [items[0], CMP, items[1], items[2]]


def test_digest_is_deterministic_and_short() -> None:
    """COMPACT-2: one line per replaced item, 12 words at most."""
    long = " ".join(f"w{n}" for n in range(50))
    replaced: list[InputItem] = [
        assistant(long),
        call("a"),
        output("a", long),
        Reasoning(id="rs_1", summary=[SummaryText(text="thought")]),
        CMP,
    ]
    text = digest(replaced)
    assert text == digest(list(replaced))
    assert text.splitlines() == [
        "Summary of 5 earlier items:",
        "- assistant: w0 w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11 …",
        '- called get_weather({"city":"Lima"})',
        "- tool result: w0 w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11 …",
        "- reasoning: thought",
        "- earlier summary: earlier",
    ]


def test_seal_round_trips_and_foreign_blobs_stay_opaque() -> None:
    assert unseal(seal("héllo\nworld")) == "héllo\nworld"
    assert unseal("gAAAAABpM0Yj-opaque") is None
    assert unseal("rcmp1.!!!") is None
    foreign = Compaction(encrypted_content="upstream-blob")
    assert summary_text(foreign).startswith("[compacted context ")


def test_prune_drops_what_the_latest_compaction_stands_for() -> None:
    """COMPACT-4."""
    items: list[InputItem] = [user("q1"), assistant("a1"), CMP, assistant("a2"), user("q2")]
    assert prune(items) == [items[0], CMP, items[3], items[4]]
    assert prune(prune(items) or []) is None  # nothing more to drop
    assert prune([user("q"), assistant("a")]) is None


_ITEMS = st.lists(
    st.sampled_from(
        [user("u"), assistant("a"), call("c1"), output("c1"), call("c2"), output("c2"), CMP]
    ),
    max_size=12,
)


@given(_ITEMS)
def test_window_properties(items: list[InputItem]) -> None:
    """COMPACT-2: client messages survive in order, one new compaction item, nothing invented,
    and every kept output still has its call."""
    fresh = Compaction(id="cmp_new", encrypted_content=seal("s"))
    result = window_items(split(items), fresh)
    assert sum(1 for i in result if i is fresh) == 1
    clients = [i for i in items if isinstance(i, Message) and i.role == "user"]
    assert [i for i in result if isinstance(i, Message) and i.role == "user"] == clients
    kept = [i for i in result if i is not fresh]
    remaining = iter(items)
    assert all(any(k is i for i in remaining) for k in kept)  # a subsequence, order kept
    calls = {i.call_id for i in result if isinstance(i, FunctionCall)}
    tail_outputs = [i for i in result if isinstance(i, FunctionCallOutput)]
    assert all(o.call_id in calls for o in tail_outputs)


def test_worth_compacting_only_when_something_is_replaced() -> None:
    """COMPACT-3: what COMPACT-2 keeps never triggers another compaction."""
    assert not worth_compacting([user("q"), call("a"), output("a")])
    assert not worth_compacting([user("q"), CMP, user("q2")])
    assert worth_compacting([user("q"), CMP, assistant("a"), user("q2")])
