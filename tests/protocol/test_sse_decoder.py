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


def reference(stream: bytes, ended: bool = True) -> list[SseEvent]:
    """The event stream format, line by line (the WHATWG algorithm, for the fields UP-2 reads):
    a line ends at LF (a CR before it dropped); a blank line dispatches the data lines read
    since the last one; ``:`` starts a comment; one space after the colon is dropped. Not
    ``ended``: only the events a blank line has completed so far."""
    events: list[SseEvent] = []
    name: str | None = None
    data: list[str] = []
    *lines, last = stream.split(b"\n")
    if not ended:
        last = b""
    lines += [last, b""] if last else [b""]  # end of stream: the last line, then a dispatch
    if not ended:
        lines = lines[:-1]
    for raw in lines:
        line = raw.removesuffix(b"\r").decode("utf-8", errors="replace")
        if not line:
            if data:
                events.append(SseEvent(name, "\n".join(data)))
            name, data = None, []
        elif not line.startswith(":"):
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "data":
                data.append(value)
            elif field == "event":
                name = value
    if data and ended:
        events.append(SseEvent(name, "\n".join(data)))
    return events


PIECES = st.sampled_from(
    [
        b"event: response.output_text.delta\n",
        b'data: {"type":"x","delta":"a\\nb"}\n',
        b"data: [DONE]\n",
        b"data:tight\n",
        b"data: \n",
        b"event: \n",
        b"event:  two spaces\n",
        b": comment\n",
        b"id: 7\n",
        b"data\n",
        b"\n",
        b"\r\n",
        b"data: crlf\r\n",
        b"data: caf\xc3\xa9 \xe2\x9c\x93\n",
        b"data: a\rb\n",
        b"data: \xff broken\n",
    ]
)


VALUE = st.text(st.characters(codec="utf-8", exclude_characters="\r\n"), max_size=12)
# What upstreams send: the usual event (``event:`` + one ``data:`` line), a data-only event,
# or any run of the lines above, each ended by a blank line (LF or CRLF).
EVENTS = st.one_of(
    st.builds(lambda t, d: f"event: {t}\ndata: {d}\n\n".encode(), VALUE, VALUE),
    st.builds(lambda d: f"data: {d}\n\n".encode(), VALUE),
    st.builds(
        lambda lines, end: b"".join(lines) + end,
        st.lists(PIECES, max_size=6),
        st.sampled_from([b"\n", b"\r\n", b""]),
    ),
)


@given(st.lists(EVENTS, max_size=12), st.lists(st.integers(min_value=0), max_size=10))
def test_any_stream_any_chunking_reads_as_the_format_says(
    events: list[bytes], cuts: list[int]
) -> None:
    """UP-2: the decoder's bulk path (whole events split at blank lines, the usual event read in
    two slices) and its line path give, together, what the format gives."""
    stream = b"".join(events)
    points = [0, *sorted(c % (len(stream) + 1) for c in cuts), len(stream)]
    chunks = [stream[a:b] for a, b in itertools.pairwise(points)]
    assert _decode(chunks) == reference(stream)


@given(st.lists(EVENTS, max_size=12), st.lists(st.integers(min_value=0), max_size=10))
def test_each_event_is_returned_by_the_feed_that_completes_it(
    events: list[bytes], cuts: list[int]
) -> None:
    """UP-2: no event waits for a later chunk: after each feed, the events returned so far are
    exactly those the bytes read so far complete (a blank line split across chunks too)."""
    stream = b"".join(events)
    points = sorted({c % (len(stream) + 1) for c in cuts} | {len(stream)})
    decoder, out, at = SseDecoder(), [], 0
    for point in points:
        out += decoder.feed(stream[at:point])
        at = point
        assert out == reference(stream[:point], ended=False)


def test_a_crlf_split_after_its_cr() -> None:
    assert _decode([b"data: x\r", b"\n\n"]) == [SseEvent(None, "x")]
    assert _decode([b"event: e\r\ndata: x\r", b"\n", b"\n"]) == [SseEvent("e", "x")]


def test_a_blank_line_split_across_chunks() -> None:
    decoder = SseDecoder()
    assert decoder.feed(b"data: a\n") == []
    assert decoder.feed(b"\ndata: b") == [SseEvent(None, "a")]
