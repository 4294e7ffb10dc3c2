"""ORD-1..8 and the codec round trip of every server event, through the pure stream builder."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import events as ev
from protocol.codec import encode, error_event
from protocol.errors import InvalidRequest
from protocol.items import Compaction, FunctionCall
from protocol.response import Response, Usage
from protocol.states import IllegalTransition
from protocol.stream import ResponseStream
from tests.support.oracle import sdk_parse

DECODER = msgspec.json.Decoder(ev.ServerEvent)

# An output "segment" is a text message (list of deltas) or a function call (name, arg deltas).
_text = st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=6)
_call = st.tuples(
    st.from_regex(r"[a-z_]{1,12}", fullmatch=True), st.lists(st.text(max_size=8), max_size=5)
)
_segment = st.one_of(_text.map(lambda d: ("text", d)), _call.map(lambda c: ("call", c)))
_ending = st.sampled_from(["completed", "failed", "incomplete", "suspend_then_complete"])


def _build(segments: list[tuple[str, Any]], ending: str, stream_id: str | None) -> list[Any]:
    stream = ResponseStream(Response(id="resp_x", created_at=1, model="m"), stream_id)
    events: list[Any] = [stream.created(), stream.in_progress()]
    calls: list[FunctionCall] = []
    for kind, payload in segments:
        if kind == "text":
            events += stream.add_message()
            events += [stream.text_delta(d) for d in payload]
            events += stream.finish_message()
        else:
            name, deltas = payload
            events.append(stream.add_function_call(name, f"call_{len(calls)}"))
            events += [stream.arguments_delta(d) for d in deltas]
            call, done = stream.finish_function_call()
            calls.append(call)
            events += done
    usage = Usage(input_tokens=3, output_tokens=2, total_tokens=5)
    if ending == "suspend_then_complete":
        events.append(stream.suspend(calls))
        events.append(stream.inject_created())
        stream.resume()
        ending = "completed"
    if ending == "completed":
        events.append(stream.completed(usage, 2))
    elif ending == "failed":
        events.append(stream.failed("server_error", "The model failed.", usage, 2))
    else:
        events.append(stream.incomplete("max_output_tokens", usage, 2))
    return events


@given(st.lists(_segment, max_size=5), _ending, st.one_of(st.none(), st.just("lane-1")))
def test_builder_ordering_and_round_trip(
    segments: list[tuple[str, Any]], ending: str, stream_id: str | None
) -> None:
    events = _build(segments, ending, stream_id)
    assert [e.sequence_number for e in events] == list(range(len(events)))  # ORD-3
    assert isinstance(events[0], ev.ResponseCreated)  # ORD-1
    assert isinstance(events[-1], ev.ResponseCompleted | ev.ResponseFailed | ev.ResponseIncomplete)
    assert all(e.stream_id == stream_id for e in events)
    added = [e.output_index for e in events if isinstance(e, ev.OutputItemAdded)]
    assert added == list(range(len(added)))  # ORD-4
    final = events[-1].response
    assert len(final.output) == len(segments)  # ORD-8: everything finished is in output
    for event in events:
        raw = encode(event)
        assert DECODER.decode(raw) == event  # codec round trip
        if not isinstance(event, ev.ResponseDone):
            sdk_parse(raw)  # and the openai SDK accepts it


def test_item_ids_match_between_added_deltas_and_done() -> None:
    events = _build([("text", ["a", "b"]), ("call", ("f", ["{", "}"]))], "completed", None)
    by_index: dict[int, set[str]] = {}
    for e in events:
        if isinstance(e, ev.OutputItemAdded | ev.OutputItemDone):
            by_index.setdefault(e.output_index, set()).add(e.item.id or "")
        elif hasattr(e, "item_id"):
            by_index.setdefault(e.output_index, set()).add(e.item_id)
    assert all(len(ids) == 1 for ids in by_index.values())


def test_snapshots_do_not_change_after_emission() -> None:
    stream = ResponseStream(Response(id="r", created_at=1, model="m"))
    created = stream.created()
    stream.in_progress()
    stream.add_message()
    stream.text_delta("hi")
    stream.finish_message()
    assert created.response.output == [] and created.response.status == "in_progress"


def test_misuse_raises_instead_of_emitting() -> None:
    stream = ResponseStream(Response(id="r", created_at=1, model="m"))
    with pytest.raises(IllegalTransition):
        stream.in_progress()  # before created
    stream.created()
    stream.in_progress()
    with pytest.raises(IllegalTransition):
        stream.text_delta("x")  # no open message
    stream.add_message()
    with pytest.raises(IllegalTransition):
        stream.completed(Usage(0, 0, 0), 1)  # item still open


def test_failure_keeps_partial_item_as_incomplete() -> None:
    stream = ResponseStream(Response(id="r", created_at=1, model="m"))
    stream.created()
    stream.in_progress()
    stream.add_message()
    stream.text_delta("partial")
    failed = stream.failed("server_error", "boom", None, 2)
    (item,) = failed.response.output
    assert item.status == "incomplete" and item.content[0].text == "partial"


def test_error_envelope_shape() -> None:
    raw = msgspec.json.decode(encode(error_event(InvalidRequest("c", "m", "p"), stream_id="s")))
    assert raw == {
        "type": "error",
        "status": 400,
        "error": {"type": "invalid_request_error", "code": "c", "message": "m", "param": "p"},
        "stream_id": "s",
    }


def test_compaction_item_is_added_and_done_at_once() -> None:
    """COMPACT-3, COMPACT-7, ORD-3: a compaction item is complete when it appears, with the
    `response.compaction.compacting` progress event between its added and done; the message
    after it takes the next output index; every event round-trips and parses with the SDK."""
    stream = ResponseStream(Response(id="resp_x", created_at=1, model="m"))
    item = Compaction(id="cmp_1", encrypted_content="rcmp1.eA==")
    events: list[Any] = [stream.created(), stream.in_progress()]
    events += stream.add_compaction(item)
    events += stream.add_message()
    events += stream.finish_message()
    events.append(stream.completed(Usage(input_tokens=1, output_tokens=1, total_tokens=2), 2))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    added, compacting, done = events[2:5]
    assert isinstance(added, ev.OutputItemAdded) and isinstance(done, ev.OutputItemDone)
    assert added.item == done.item == item and added.output_index == done.output_index == 0
    assert isinstance(compacting, ev.CompactionCompacting)
    assert (compacting.item_id, compacting.output_index) == ("cmp_1", 0)
    assert events[5].output_index == 1
    assert [o.type for o in sdk_parse(encode(events[-1])).response.output] == [
        "compaction",
        "message",
    ]
    for event in events:
        assert DECODER.decode(encode(event)) == event
        sdk_parse(encode(event))


def _row(delta: str, done: str, part: bool) -> list[str]:
    """An item's events with two deltas: added, its part, the deltas, done, part done, done."""
    parts = ["response.content_part.added"] if part else []
    closes = ["response.content_part.done"] if part else []
    return [
        "response.output_item.added",
        *parts,
        delta,
        delta,
        done,
        *closes,
        "response.output_item.done",
    ]


_ROWS = {
    "message": (
        "msg_",
        "text",
        _row("response.output_text.delta", "response.output_text.done", True),
    ),
    "reasoning": (
        "rs_",
        "text",
        _row("response.reasoning_text.delta", "response.reasoning_text.done", True),
    ),
    "function_call": (
        "fc_",
        "arguments",
        _row(
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            False,
        ),
    ),
    "custom_tool_call": (
        "ctc_",
        "input",
        _row(
            "response.custom_tool_call_input.delta",
            "response.custom_tool_call_input.done",
            False,
        ),
    ),
}


@pytest.mark.parametrize("kind", list(_ROWS))
def test_each_kind_of_open_item_streams_as_its_row_says(kind: str) -> None:
    """ORD-1..ORD-5, REASON-2, TOOL-3: every kind of streamed item (one row of the builder's
    table) opens, takes deltas and closes with its own events, one item id throughout, the
    streamed text whole in its ``*.done`` event and in the item, each event as the SDK reads
    it."""
    stream = ResponseStream(Response(id="resp_x", created_at=1, model="m"), None)
    stream.created()
    stream.in_progress()
    events: list[Any] = []
    if kind == "message":
        events += [*stream.add_message(), stream.text_delta("Hel"), stream.text_delta("lo")]
        events += stream.finish_message()
    elif kind == "reasoning":
        events += [*stream.add_reasoning(), stream.reasoning_delta("Hel")]
        events += [stream.reasoning_delta("lo"), *stream.finish_reasoning()]
    else:
        custom = kind == "custom_tool_call"
        events.append(stream.add_function_call("f", "call_1", custom=custom))
        events += [stream.arguments_delta("Hel"), stream.arguments_delta("lo")]
        events += stream.finish_function_call()[1]
    prefix, field, types = _ROWS[kind]
    wire = [msgspec.json.decode(encode(e)) for e in events]
    assert [e["type"] for e in wire] == types
    assert {e["item"]["id"] if "item" in e else e["item_id"] for e in wire} == {
        wire[0]["item"]["id"]
    }
    assert wire[0]["item"]["id"].startswith(prefix) and wire[0]["item"]["type"] == kind
    done_item = wire[-1]["item"]
    assert done_item["type"] == kind and done_item["status"] == "completed"
    finished = next(
        e for e in wire if e["type"].endswith(".done") and "item" not in e and "part" not in e
    )
    assert finished[field] == "Hello"
    if kind in ("message", "reasoning"):
        assert done_item["content"][0]["text"] == "Hello"
        assert wire[-2]["part"] == done_item["content"][0]
    for event in wire:
        sdk_parse(event)


def test_ids_are_128_random_bits_and_a_forked_child_draws_its_own() -> None:
    """Ids are drawn ahead in a pool; a forked worker must not repeat its parent's."""
    import os
    import re

    from protocol.stream import new_id

    ids = {new_id("resp") for _ in range(600)}  # more than one draw of the pool
    assert len(ids) == 600 and all(re.fullmatch(r"resp_[0-9a-f]{32}", i) for i in ids)
    new_id("resp")  # the pool now holds ids the child must not hand out
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        os.close(read)
        os.write(write, " ".join(new_id("resp") for _ in range(5)).encode())
        os._exit(0)
    os.close(write)
    child = set(os.read(read, 4096).decode().split())
    os.close(read)
    os.waitpid(pid, 0)
    mine = {new_id("resp") for _ in range(5)}
    assert len(child) == 5 and not child & mine
