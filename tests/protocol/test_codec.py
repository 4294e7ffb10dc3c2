"""CODEC-*: decoding client events, input normalisation, errors with JSON-path params."""

from __future__ import annotations

import sys

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.codec import (
    decode_client_event,
    decode_create_body,
    encode,
    parse_input,
    snapshot_pieces,
)
from protocol.errors import InvalidRequest
from protocol.events import (
    ResponseAppend,
    ResponseCompleted,
    ResponseCreate,
    ResponseCreated,
    ResponseDone,
    ResponseInject,
    ResponseInProgress,
)
from protocol.items import (
    FunctionCall,
    FunctionCallOutput,
    InputImage,
    InputText,
    ItemReference,
    Message,
    Reasoning,
)
from protocol.response import CreateParams, Response


def _error(frame: bytes | str) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        decode_client_event(frame)
    return info.value


@pytest.mark.parametrize(
    ("frame", "code", "param"),
    [
        (b"{", "invalid_json", None),
        (b"[1, 2]", "invalid_event", None),
        (b'{"model": "x"}', "missing_required_parameter", "type"),
        (b'{"type": "response.cancel"}', "unknown_event_type", "type"),
        (
            b'{"type": "response.create", "max_output_tokens": "a"}',
            "invalid_type",
            "max_output_tokens",
        ),
        (
            b'{"type": "response.create", "tools": [{"type": "no_such_tool"}]}',
            "invalid_value",
            "tools[0].type",
        ),
        (b'{"type": "response.append", "input": []}', "missing_required_parameter", "response_id"),
        (b'{"type": "response.create", "store": "yes"}', "invalid_type", "store"),
    ],
)
def test_decode_errors_name_the_field(frame: bytes, code: str, param: str | None) -> None:
    err = _error(frame)
    assert (err.code, err.param, err.status) == (code, param, 400)
    assert "Traceback" not in err.message and "msgspec" not in err.message


def test_unknown_event_type_is_not_echoed_when_huge() -> None:
    err = _error(b'{"type": "' + b"x" * 10_000 + b'"}')
    assert len(err.message) < 200


def test_create_accepts_and_ignores_unknown_fields() -> None:
    event = decode_client_event(
        b'{"type": "response.create", "model": "m", "input": "hi", "stream": true,'
        b' "client_metadata": {"a": 1}, "prompt_cache_key": "k", "include": [], "future": 1}'
    )
    assert isinstance(event, ResponseCreate)
    assert event.model == "m" and event.stream is True


def test_append_and_inject_decode() -> None:
    body = (
        b'"response_id": "resp_1", '
        b'"input": [{"type": "function_call_output", "call_id": "c", "output": "o"}]'
    )
    assert isinstance(
        decode_client_event(b'{"type": "response.append", ' + body + b"}"), ResponseAppend
    )
    assert isinstance(
        decode_client_event(b'{"type": "response.inject", ' + body + b"}"), ResponseInject
    )


def test_parse_input_standard_shapes() -> None:
    items = parse_input(
        [
            {"role": "user", "content": "hi"},  # Agents SDK: no "type"
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": "d"}],
            },
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "a", "annotations": []}],
                "phase": "final_answer",
            },
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_image", "image_url": "data:image/png;base64,AAAA"}],
            },
            {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "c1",
                "name": "f",
                "arguments": "{}",
                "status": "completed",
            },
            {
                "type": "function_call_output",
                "call_id": "c1",
                "output": [{"type": "input_text", "text": "r"}],
            },
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "xyz"},
            {"type": "item_reference", "id": "fc_1"},
        ]
    )
    kinds = [type(i) for i in items]
    assert kinds == [
        Message,
        Message,
        Message,
        Message,
        FunctionCall,
        FunctionCallOutput,
        Reasoning,
        ItemReference,
    ]
    assert isinstance(items[3], Message) and isinstance(items[3].content[0], InputImage)
    assert parse_input("hello") == [Message(role="user", content="hello")]


def test_parse_input_error_path() -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_input(
            [{"role": "user", "content": "x"}, {"type": "function_call_output", "output": "o"}]
        )
    assert info.value.param == "input[1].call_id"
    with pytest.raises(InvalidRequest) as info:
        parse_input([{"type": "no_such_item"}])
    assert info.value.param == "input[0].type"
    with pytest.raises(InvalidRequest) as info:  # an opaque item still needs its fields (ITEM-7)
        parse_input([{"type": "computer_call", "id": "cu_1"}])
    assert info.value.param == "input[0].call_id"
    with pytest.raises(InvalidRequest) as info:
        parse_input([{"role": "robot", "content": "x"}])
    assert info.value.param == "input[0].role"


def test_http_body_decoding() -> None:
    params = decode_create_body(b'{"model": "m", "input": "x", "stream": true}')
    assert params.stream is True
    with pytest.raises(InvalidRequest):
        decode_create_body(b"not json")


_texts = st.text(max_size=200)
_item = st.one_of(
    st.builds(
        Message, role=st.sampled_from(["user", "assistant", "system", "developer"]), content=_texts
    ),
    st.builds(
        Message,
        role=st.just("user"),
        content=st.lists(st.builds(InputText, text=_texts), max_size=3),
    ),
    st.builds(FunctionCall, call_id=_texts, name=_texts, arguments=_texts),
    st.builds(FunctionCallOutput, call_id=_texts, output=_texts),
    st.builds(ItemReference, id=_texts),
)


@given(st.lists(_item, max_size=8))
def test_input_items_round_trip(items: list[object]) -> None:
    raw = msgspec.json.decode(encode(items))
    assert parse_input(raw) == items


@given(
    st.builds(
        ResponseCreate,
        model=st.one_of(st.none(), _texts),
        input=st.one_of(_texts, st.lists(st.dictionaries(_texts, _texts, max_size=3), max_size=3)),
        instructions=st.one_of(st.none(), _texts),
        previous_response_id=st.one_of(st.none(), _texts),
        max_output_tokens=st.one_of(st.none(), st.integers(0, 10**6)),
        store=st.booleans(),
        stream_id=st.one_of(st.none(), _texts),
        generate=st.booleans(),
    )
)
def test_client_create_round_trip(event: ResponseCreate) -> None:
    assert decode_client_event(encode(event)) == event


@given(
    st.builds(
        ResponseAppend,
        response_id=_texts,
        input=st.lists(st.dictionaries(_texts, _texts, max_size=2), max_size=3),
    )
)
def test_client_append_round_trip(event: ResponseAppend) -> None:
    assert decode_client_event(encode(event)) == event


_TEXTS = st.text(alphabet=st.characters(codec="utf-8"), max_size=40) | st.sampled_from(
    ["\x00rollout-static-", '"tools":[]', '"instructions":null', "\\u0000"]
)


@given(instructions=st.none() | _TEXTS, names=st.lists(_TEXTS, max_size=3), note=_TEXTS)
def test_snapshot_events_encode_as_one_whole(
    instructions: str | None, names: list[str], note: str
) -> None:
    """CODEC-6: splicing the once-encoded instructions and tools gives the very bytes of
    encoding the whole event, whatever the other fields hold (even look-alike strings)."""
    tools = [  # as sent, raw (TOOL-1)
        msgspec.Raw(msgspec.json.encode({"type": "function", "name": f"t{i}", "x": [name, note]}))
        for i, name in enumerate(names)
    ]
    response = Response(
        id="resp_1", created_at=1, model="m", instructions=instructions, tools=tools,
        metadata={"tools": note}, text={"format": {"type": "text"}, "note": note},
    )  # fmt: skip
    for event in (
        ResponseCreated(sequence_number=0, response=response),
        ResponseInProgress(sequence_number=1, response=response),
        ResponseCompleted(sequence_number=2, response=response),
        ResponseDone(sequence_number=3, response=response, pending_calls=[]),
    ):
        once = encode(event)
        assert once == msgspec.json.encode(event)
        assert encode(event) == once  # the second time from the cache
        assert snapshot_pieces(event) == (once,)  # small parts: encoded whole, faster
        pieces = snapshot_pieces(event, 0)  # what a socket writes and deflates piece by piece
        assert b"".join(pieces) == once
        assert len(pieces) == 1 + 2 * (bool(tools) + bool(instructions))
        again = snapshot_pieces(event, 0)
        assert all(a is b for a, b in zip(pieces[1::2], again[1::2], strict=True))  # once each


def test_the_encoded_parts_are_bounded_in_bytes() -> None:
    """CODEC-6: the once-encoded parts are kept within their byte bound whatever the requests
    send (24 distinct 1 MiB instructions against a 16 MiB bound), the count kept true."""
    from protocol import codec

    for i in range(24):
        instructions = chr(65 + i) * (1 << 20)
        response = Response(id="resp_1", created_at=1, model="m", instructions=instructions)
        encode(ResponseCreated(sequence_number=0, response=response))
        assert codec._static_size <= codec._STATIC_BYTES
    assert codec._static_size == sum(len(data) for _, data in codec._static.values())


def test_a_toolset_does_not_pin_its_request_frame() -> None:
    """LIM-21: a decoded tool is a view into the whole frame; the toolset (which outlives the
    request in rollouts, lane and hydration caches and parked rollouts) keeps its own copy, so a
    1 MiB frame is freed once the request is done with it."""
    frame = msgspec.json.encode(
        {
            "type": "response.create",
            "model": "m",
            "input": "x" * 1_000_000,
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        }
    )
    alone = sys.getrefcount(frame)
    event = decode_client_event(frame)
    assert isinstance(event, CreateParams)
    toolset = event.toolset
    del event
    assert sys.getrefcount(frame) == alone  # nothing kept holds the frame
    assert bytes(toolset.raw[0]).startswith(b'{"type":"function"')
