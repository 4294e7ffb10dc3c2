"""Wire helpers: URL mapping, event decoding leniency, SSE framing."""

from __future__ import annotations

import pytest

from clients.exceptions import ProtocolViolation
from clients.wire import decode_event, http_url, ws_url
from protocol import events as ev
from protocol.sse import SseDecoder


@pytest.mark.parametrize(
    ("base", "ws", "http"),
    [
        ("http://h:1/v1", "ws://h:1/v1/responses", "http://h:1/v1/responses"),
        ("https://h/v1/", "wss://h/v1/responses", "https://h/v1/responses"),
        ("ws://h:2/v1/responses", "ws://h:2/v1/responses", "http://h:2/v1/responses"),
    ],
)
def test_urls(base: str, ws: str, http: str) -> None:
    assert ws_url(base) == ws
    assert http_url(base) == http


def test_decode_known_unknown_and_malformed() -> None:
    event = decode_event(
        b'{"type":"response.inject.created","sequence_number":3,"response_id":"r"}'
    )
    assert isinstance(event, ev.InjectCreated) and event.sequence_number == 3
    assert decode_event('{"type":"response.future_feature","x":1}') is None
    with pytest.raises(ProtocolViolation, match=r"malformed response\.created"):
        decode_event(b'{"type":"response.created","sequence_number":0}')
    with pytest.raises(ProtocolViolation, match="invalid JSON"):
        decode_event(b"{nope")


def test_sse_split_chunks_crlf_and_multiline() -> None:
    """The shared decoder (protocol.sse) as the HTTP client feeds it: an unterminated last
    event is never handed over, since the client reads until a terminal event."""
    decoder = SseDecoder()
    parts = (
        b'event: a\ndata: {"x"',
        b": 1}\n\n: comment\r\nevent: b\r\ndata: line1\r\n",
        b"data: line2\r\n\r\n",
        b"data: unterminated\n",
    )
    data = [event.data for part in parts for event in decoder.feed(part)]
    assert data == ['{"x": 1}', "line1\nline2"]
