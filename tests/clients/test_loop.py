"""TurnReader: how server events fold into turns, and what it refuses (pure, no server)."""

from __future__ import annotations

import pytest

from clients.exceptions import ApiError, AppendRejected, ProtocolViolation, RolloutFailed
from clients.loop import Hooks, TurnReader, add_usage
from protocol import events as ev
from protocol.codec import error_event
from protocol.errors import NotFound
from protocol.events import InjectError, InjectFailed
from protocol.items import FunctionCall
from protocol.response import InputTokensDetails, Response, Usage
from protocol.stream import ResponseStream


def new_stream() -> ResponseStream:
    return ResponseStream(Response(id="resp_1", created_at=0, model="m"))


def call_turn(stream: ResponseStream, call_id: str) -> list[ev.ServerEvent]:
    events: list[ev.ServerEvent] = [stream.add_function_call("read_file", call_id)]
    events.append(stream.arguments_delta('{"path":"a"}'))
    _call, done = stream.finish_function_call()
    return events + done


def feed_all(reader: TurnReader, events: list[ev.ServerEvent]) -> list[object]:
    return [reader.feed(e) for e in events]


def test_append_turns_end_at_response_done_then_completed() -> None:
    stream = new_stream()
    seen: list[str] = []
    reader = TurnReader(Hooks(on_event=lambda e: seen.append(type(e).__name__)), append=True)
    events = [stream.created(), stream.in_progress(), *call_turn(stream, "c1")]
    assert feed_all(reader, events) == [None] * len(events)
    end = reader.feed(stream.suspend([c for c in stream.output if isinstance(c, FunctionCall)]))
    assert end is not None and [c.call_id for c in end.calls] == ["c1"] and end.usage is None
    stream.resume()
    feed_all(reader, [stream.inject_created(), *stream.add_message(), stream.text_delta("ok")])
    feed_all(reader, stream.finish_message())
    final = reader.feed(stream.completed(Usage(10, 2, 12), 1))
    assert final is not None and final.calls == [] and final.text == "ok"
    assert len(final.items) == 1 and final.usage == Usage(10, 2, 12)
    assert reader.response_ids == ["resp_1"] and seen[0] == "ResponseCreated"


def test_standard_turn_runs_the_calls_of_a_completed_response() -> None:
    stream = new_stream()
    reader = TurnReader(Hooks(), append=False)
    feed_all(reader, [stream.created(), stream.in_progress(), *call_turn(stream, "c9")])
    end = reader.feed(stream.completed(Usage(1, 1, 2), 1))
    assert end is not None and [c.call_id for c in end.calls] == ["c9"]


def test_sequence_gap_is_a_protocol_violation() -> None:
    stream = new_stream()
    reader = TurnReader(Hooks(), append=True)
    reader.feed(stream.created())
    stream.in_progress()  # never delivered
    with pytest.raises(ProtocolViolation, match="expected 1"):
        reader.feed(stream.add_function_call("x", "c"))


def test_event_before_response_created_is_a_protocol_violation() -> None:
    stream = new_stream()
    stream.created()
    with pytest.raises(ProtocolViolation, match="outside a response"):
        TurnReader(Hooks(), append=False).feed(stream.in_progress())


def test_response_done_in_standard_mode_and_unknown_pending_calls() -> None:
    stream = new_stream()
    reader = TurnReader(Hooks(), append=False)
    feed_all(reader, [stream.created(), stream.in_progress()])
    with pytest.raises(ProtocolViolation, match="standard mode"):
        reader.feed(stream.suspend([]))
    stream = new_stream()
    reader = TurnReader(Hooks(), append=True)
    feed_all(reader, [stream.created(), stream.in_progress()])
    done = stream.suspend([])
    done.pending_calls = [ev.PendingCall(call_id="ghost", name="x")]
    with pytest.raises(ProtocolViolation, match="ghost"):
        reader.feed(done)


def test_error_failed_and_inject_failed_raise_client_errors() -> None:
    reader = TurnReader(Hooks(), append=True)
    with pytest.raises(ApiError) as info:
        reader.feed(error_event(NotFound("response_not_found", "gone", "response_id")))
    assert (info.value.status, info.value.code, info.value.param) == (
        404,
        "response_not_found",
        "response_id",
    )
    stream = new_stream()
    feed_all(reader, [stream.created(), stream.in_progress()])
    with pytest.raises(AppendRejected, match="bad_call"):
        rejected = InjectFailed(
            sequence_number=stream.inject_created().sequence_number,  # takes the next number
            response_id=stream.id,
            error=InjectError(code="bad_call", message="unknown call id"),
            input=[],
        )
        reader.feed(rejected)
    with pytest.raises(RolloutFailed, match="server_error") as failed:
        reader.feed(stream.failed("server_error", "boom", None, 1))
    assert failed.value.response.status == "failed"


def test_add_usage_sums_every_counter() -> None:
    a = Usage(3, 1, 4, InputTokensDetails(cached_tokens=2))
    total = add_usage(a, a)
    assert (total.input_tokens, total.output_tokens, total.total_tokens) == (6, 2, 8)
    assert total.input_tokens_details.cached_tokens == 4
