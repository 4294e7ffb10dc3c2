"""The SSE decoder (upstreams, clients, bench): any chunking of the bytes yields the same events
(UP-2)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import sse
from protocol.sse import SseDecoder, SseEvent, SseTooLarge

STREAM = (
    b": keep-alive\n\n"
    b'event: response.created\r\ndata: {"a": 1}\r\n\r\n'
    b"data: line one\ndata: line two\n\n"
    b"data:no-space\n\n"
    b"data: [DONE]\n\n"
)
EXPECTED = [
    SseEvent("response.created", '{"a": 1}'),
    SseEvent(None, "line one\nline two"),
    SseEvent(None, "no-space"),
    SseEvent(None, "[DONE]"),
]


def _decode(chunks: list[bytes]) -> list[SseEvent]:
    decoder = SseDecoder()
    out: list[SseEvent] = []
    for chunk in chunks:
        out.extend(decoder.feed(chunk))
    return out + decoder.close()


def test_whole_stream() -> None:
    assert _decode([STREAM]) == EXPECTED


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_any_chunking_gives_the_same_events(cuts: list[int]) -> None:
    points = [0, *sorted(cuts), len(STREAM)]
    chunks = [STREAM[a:b] for a, b in itertools.pairwise(points)]
    assert _decode(chunks) == EXPECTED


def test_last_event_without_blank_line_counts() -> None:
    assert _decode([b"data: tail"]) == [SseEvent(None, "tail")]


def test_multibyte_character_split_across_chunks() -> None:
    raw = "data: héllo ✓\n\n".encode()
    assert _decode([raw[:8], raw[8:]]) == [SseEvent(None, "héllo ✓")]


def test_oversized_event_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sse, "MAX_EVENT_BYTES", 64)
    decoder = SseDecoder()
    with pytest.raises(SseTooLarge):
        for _ in range(10):
            decoder.feed(b"data: " + b"x" * 20 + b"\n")
