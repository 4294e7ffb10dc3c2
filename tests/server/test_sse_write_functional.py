"""HTTP-8: an SSE stream's frames produced within one event-loop iteration leave as one HTTP
chunk; the stream itself (the bytes once de-chunked) is the same. Read off a raw socket, so
the chunk boundaries the server wrote are what the test sees. The head leaves with the first
chunk and the stream's end with the last: the writes the server hands its transport are
recorded where aiohttp's writer makes them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable

import pytest
from aiohttp.http_writer import StreamWriter

from tests.support.server import LiveServer


async def _chunks(server: LiveServer, body: dict[str, object]) -> list[bytes]:
    """POST ``body`` over HTTP/1.1 and return the response's chunks, in this test's own
    reading of RFC 9112 §7.1 (size line, data, CRLF; a zero size ends it)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    payload = json.dumps(body).encode()
    writer.write(
        b"POST /v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(payload), payload)
    )
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"chunked" in head.lower()
    chunks: list[bytes] = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).strip(), 16)
        data = await reader.readexactly(size + 2)
        if size == 0:
            break
        chunks.append(data[:-2])
    writer.close()
    return chunks


def _events(stream: bytes) -> list[str]:
    return [json.loads(block.split(b"data: ", 1)[1])["type"] for block in stream.split(b"\n\n")
            if block]  # fmt: skip


async def test_frames_of_one_iteration_leave_as_one_chunk(server: LiveServer) -> None:
    chunks = await _chunks(server, {"model": "sim", "input": "hi", "stream": True})
    events = _events(b"".join(chunks))
    assert events[:2] == ["response.created", "response.in_progress"]
    assert events[-1] == "response.completed"
    assert len(chunks) < len(events)  # coalesced (HTTP-8)
    # the opening pair is written back to back, so it shares the first chunk
    assert _events(chunks[0])[:2] == ["response.created", "response.in_progress"]
    for chunk in chunks:  # a chunk holds whole events only
        assert chunk.endswith(b"\n\n") and chunk.startswith(b"event: ")


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every write aiohttp's HTTP writer hands a transport (its two exits), as one byte string
    each."""
    made: list[bytes] = []
    write, writelines = StreamWriter._write, StreamWriter._writelines

    def one(self: StreamWriter, chunk: bytes) -> None:
        made.append(bytes(chunk))
        write(self, chunk)

    def many(self: StreamWriter, chunks: Iterable[bytes]) -> None:
        parts = list(chunks)
        made.append(b"".join(parts))
        writelines(self, parts)

    monkeypatch.setattr(StreamWriter, "_write", one)
    monkeypatch.setattr(StreamWriter, "_writelines", many)
    return made


async def test_head_leaves_with_the_first_chunk_and_the_end_with_the_last(
    server: LiveServer, writes: list[bytes]
) -> None:
    chunks = await _chunks(server, {"model": "sim", "input": "hi", "stream": True})
    assert _events(b"".join(chunks))[-1] == "response.completed"
    first, last = writes[0], writes[-1]
    assert first.startswith(b"HTTP/1.1 200") and b"event: response.created" in first
    assert last.endswith(b"\r\n0\r\n\r\n") and b"event: response.completed" in last
    assert len(writes) <= len(chunks)  # no write of a head or an end alone
