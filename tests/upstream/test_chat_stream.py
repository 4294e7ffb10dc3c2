"""Chat-completions chunks -> deltas (UP-CHAT-5..UP-CHAT-8), without any I/O."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from engine.conversation.tokens import count
from engine.models.base import ArgsDelta, CallEnd, CallStart, Delta, Finish, TextDelta
from engine.models.upstreams.chat_stream import Chunk, ChunkMapper
from engine.models.upstreams.endpoint import UpstreamError
from tests.upstream.peer import Call, Reply, chat_frames


def run(*chunks: dict[str, Any]) -> list[Delta]:
    mapper = ChunkMapper()
    out: list[Delta] = []
    for raw in chunks:
        out.extend(mapper.feed(msgspec.json.decode(json.dumps(raw), type=Chunk)))
    return out + mapper.finish()


def frames_as_chunks(reply: Reply) -> list[dict[str, Any]]:
    """The peer's exact wire chunks (what vLLM sends), decoded back to dicts."""
    out = []
    for frame in chat_frames(reply, "m"):
        data = frame.decode().removeprefix("data: ").strip()
        if data != "[DONE]":
            out.append(json.loads(data))
    return out


def args_of(deltas: list[Delta]) -> str:
    return "".join(d.text for d in deltas if isinstance(d, ArgsDelta))


def test_text_with_role_chunk_and_usage() -> None:
    deltas = run(*frames_as_chunks(Reply(text="Hello there, world")))
    assert "".join(d.text for d in deltas if isinstance(d, TextDelta)) == "Hello there, world"
    assert deltas[-1] == Finish("stop", 7, input_tokens=11)


def test_two_parallel_calls_keyed_by_index() -> None:
    calls = [Call("get_weather", '{"city":"Paris"}', "c1"), Call("get_time", '{"tz":"CET"}', "c2")]
    deltas = run(*frames_as_chunks(Reply(text="Let me check.", calls=calls)))
    kinds = [type(d).__name__ for d in deltas]
    first_end = kinds.index("CallEnd")
    assert deltas[kinds.index("CallStart")] == CallStart("c1", "get_weather")
    assert args_of(deltas[:first_end]) == '{"city":"Paris"}'
    second = deltas[first_end + 1]
    assert second == CallStart("c2", "get_time")
    assert args_of(deltas[first_end + 1 :]) == '{"tz":"CET"}'
    assert kinds.count("CallEnd") == 2
    assert deltas[-1] == Finish("tool_calls", 7, input_tokens=11)


def test_same_index_with_a_new_id_is_a_new_call() -> None:
    """Servers that put every call at index 0 (one complete call per chunk)."""
    one = {"index": 0, "id": "a", "function": {"name": "f", "arguments": "{}"}}
    two = {"index": 0, "id": "b", "function": {"name": "g", "arguments": "{}"}}
    deltas = run(
        {"choices": [{"delta": {"tool_calls": [one]}}]},
        {"choices": [{"delta": {"tool_calls": [two]}}]},
    )
    assert [d for d in deltas if isinstance(d, CallStart)] == [
        CallStart("a", "f"),
        CallStart("b", "g"),
    ]


def test_arguments_before_the_name_are_held_and_missing_id_is_generated() -> None:
    deltas = run(
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"a"'}}]}}]},
        {
            "choices": [
                {
                    "delta": {
                        "tool_calls": [{"index": 0, "function": {"name": "f", "arguments": ":1}"}}]
                    }
                }
            ]
        },
    )
    start = deltas[0]
    assert isinstance(start, CallStart) and start.name == "f" and start.call_id.startswith("call_")
    assert args_of(deltas) == '{"a":1}'


def test_interleaved_call_chunks_are_an_upstream_error() -> None:
    a = {"index": 0, "id": "a", "function": {"name": "f", "arguments": "{"}}
    b = {"index": 1, "id": "b", "function": {"name": "g", "arguments": "{"}}
    late = {"index": 0, "function": {"arguments": "}"}}
    with pytest.raises(UpstreamError, match="interleaved"):
        run(*({"choices": [{"delta": {"tool_calls": [tc]}}]} for tc in (a, b, late)))


def test_whitespace_before_a_call_is_not_a_message() -> None:
    call = {"index": 0, "id": "a", "function": {"name": "f", "arguments": "{}"}}
    deltas = run(
        {"choices": [{"delta": {"content": "\n\n"}}]},
        {"choices": [{"delta": {"tool_calls": [call]}}]},
    )
    assert not any(isinstance(d, TextDelta) for d in deltas)
    held = run(
        {"choices": [{"delta": {"content": "\n"}}]}, {"choices": [{"delta": {"content": "Hi"}}]}
    )
    assert held[0] == TextDelta("\nHi")


def test_length_and_missing_usage_falls_back_to_our_tokenizer() -> None:
    chunks = frames_as_chunks(Reply(text="Once upon a time", finish="length", usage=None))
    deltas = run(*chunks)
    assert deltas[-1] == Finish("length", count("Once upon a time"), usage_estimated=True)


def test_reasoning_content_is_skipped_and_cached_tokens_kept() -> None:
    usage = {
        "prompt_tokens": 50,
        "completion_tokens": 9,
        "prompt_tokens_details": {"cached_tokens": 32},
    }
    mapper = ChunkMapper()
    raw = {"choices": [{"delta": {"reasoning_content": "thinking"}}], "usage": None}
    assert mapper.feed(msgspec.json.decode(json.dumps(raw), type=Chunk)) == []
    mapper.feed(msgspec.json.decode(json.dumps({"choices": [], "usage": usage}), type=Chunk))
    assert mapper.finish()[-1] == Finish("stop", 9, input_tokens=50, cached_tokens=32)
    assert mapper.reasoning_chunks == 1


def test_call_end_before_text_that_follows_a_call() -> None:
    call = {"index": 0, "id": "a", "function": {"name": "f", "arguments": "{}"}}
    deltas = run(
        {"choices": [{"delta": {"tool_calls": [call]}}]},
        {"choices": [{"delta": {"content": "after"}}]},
    )
    assert [type(d) for d in deltas] == [CallStart, ArgsDelta, CallEnd, TextDelta, Finish]
