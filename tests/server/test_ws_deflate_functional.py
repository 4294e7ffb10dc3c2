"""permessage-deflate that pays (WS-19), read byte by byte from a raw socket: on a socket that
negotiated it, a message of ``DEFLATE_MIN_BYTES`` or more is one compressed frame (RSV1 set), a
smaller one an uncompressed frame (RSV1 clear, RFC 7692 §6), and the messages, once inflated,
are the same events an uncompressed socket gets."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import random
import struct
import zlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.server.transport.frames import (
    DEFLATE_MIN_BYTES,
    DEFLATE_WINDOW_BITS,
    Deflater,
    Parts,
)
from tests.support.server import LiveServer

TAIL = b"\x00\x00\xff\xff"
CREATE = {
    "type": "response.create",
    "model": "sim",
    "instructions": "Answer briefly. " * 120,  # the created/completed snapshots pass the bound
    "input": "Say hello in a few words.",
    "store": False,
}


def masked_text(payload: bytes) -> bytes:
    n, key = len(payload), os.urandom(4)
    head = bytes((0x81, 0x80 | 126)) + struct.pack(">H", n) if n >= 126 else bytes((0x81, 0x80 | n))
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


async def messages(live: LiveServer, deflate: bool) -> list[tuple[bool, bytes]]:
    """One response over a raw socket: each message as (sent compressed, its JSON bytes)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", live.port)
    key = base64.b64encode(os.urandom(16)).decode()
    offer = "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n"
    writer.write(
        f"GET /v1/responses HTTP/1.1\r\nHost: 127.0.0.1:{live.port}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
        f"{offer if deflate else ''}\r\n".encode()
    )
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101")
    assert (b"permessage-deflate" in head) is deflate
    writer.write(masked_text(json.dumps(CREATE).encode()))
    inflate = zlib.decompressobj(-15)  # one window across messages (context takeover)
    out: list[tuple[bool, bytes]] = []
    try:
        while not out or json.loads(out[-1][1])["type"] != "response.completed":
            first, second = await asyncio.wait_for(reader.readexactly(2), 10)
            assert first & 0x80 and first & 0x0F == 0x1, "one whole text frame per message"
            n = second & 0x7F
            if n == 126:
                n = struct.unpack(">H", await reader.readexactly(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", await reader.readexactly(8))[0]
            payload = await reader.readexactly(n)
            compressed = bool(first & 0x40)
            out.append((compressed, inflate.decompress(payload + TAIL) if compressed else payload))
    finally:
        writer.close()
    return out


def shape(message: bytes) -> Any:
    """The event without what differs between two runs (ids, times)."""
    event = json.loads(message)
    return event["type"], event.get("sequence_number"), event.get("delta")


async def test_only_messages_worth_compressing_are_compressed(server: LiveServer) -> None:
    """WS-19: RSV1 is set exactly on the messages of ``DEFLATE_MIN_BYTES`` or more; both kinds
    occur in one response; every message inflates to the event an uncompressed socket sends."""
    deflated = await messages(server, deflate=True)
    for compressed, message in deflated:
        assert compressed is (len(message) >= DEFLATE_MIN_BYTES), (compressed, len(message))
    assert {c for c, _ in deflated} == {True, False}
    plain = await messages(server, deflate=False)
    assert not any(c for c, _ in plain)
    assert [shape(m) for _, m in deflated] == [shape(m) for _, m in plain]


_PARTS_POOL = [bytes(random.Random(i).choices(b'{}":,abcdef tools', k=n)) for i, n in
               enumerate((1024, 3000, 700, 5000))]  # fmt: skip
# Messages repeat what earlier ones held (as a rollout's events do), so the compressor refers
# back across messages and across what was spliced between.
_TEXTS = [b'{"type":"response.output_text.delta","delta":"%s"}' % b"word " * n for n in (60, 300)]
_PLAIN = st.sampled_from(_TEXTS + _PARTS_POOL) | st.binary(min_size=1, max_size=1500)
_PIECES = st.lists(st.binary(max_size=400) | st.sampled_from(_PARTS_POOL), min_size=1, max_size=4)
_MESSAGES = st.lists(st.tuples(st.booleans(), _PIECES, _PLAIN), min_size=1, max_size=8)


def trickle(inflate: Any, data: bytes) -> bytes:
    """Inflate a few bytes at a time, so only the window is behind each output: a back
    reference farther than the negotiated window fails, as in a client that keeps no more."""
    out = [inflate.decompress(data, 64)]
    while inflate.unconsumed_tail or len(out[-1]) == 64:
        out.append(inflate.decompress(inflate.unconsumed_tail, 64))
    return b"".join(out)


@given(messages=_MESSAGES, bits=st.sampled_from([9, 12, 15]), no_takeover=st.booleans())
def test_spliced_parts_inflate_to_the_same_bytes(
    messages: list[tuple[bool, list[bytes], bytes]], bits: int, no_takeover: bool
) -> None:
    """WS-19: a snapshot's unchanging parts, compressed once and spliced into the socket's
    stream, inflate to the very bytes of the message, on one decompressor kept across the
    messages (context takeover) or on a new one for each (no takeover), whatever comes before
    and after, plain messages between, at every window the extension negotiates, with parts
    dropped from a small cache."""
    parts = Parts(limit_bytes=9000)
    deflater = Deflater(bits, no_takeover, parts)
    inflate = zlib.decompressobj(-bits)
    for spliced, pieces, plain in messages:
        if no_takeover:  # each message stands alone: a client may inflate it so
            inflate = zlib.decompressobj(-bits)
        # dynamic and unchanging pieces in turn, as protocol.codec.snapshot_pieces gives them
        shaped = (*(p for piece in pieces for p in (plain, piece)), plain)
        _, payload = deflater.frame_pieces(shaped) if spliced else deflater.frame(plain)
        expected = b"".join(shaped) if spliced else plain
        assert trickle(inflate, payload + TAIL) == expected
    assert parts.size <= 9000


def test_an_unchanging_part_is_compressed_once_per_key_and_spliced() -> None:
    """WS-19: the second snapshot carrying the same part holds that part's one compressed
    stream verbatim (no deflate call over it), on two sockets of one key alike, and for equal
    bytes of another request; another key's socket never reuses it (its timing would show
    that someone sent the same text)."""
    parts = Parts()
    part = _PARTS_POOL[3]
    blob = parts.compressed("key-a", DEFLATE_WINDOW_BITS, part)  # the socket's own window
    for _ in range(2):
        deflater = Deflater(15, no_takeover=False, parts=parts, owner="key-a")
        for seq in range(2):
            _, payload = deflater.frame_pieces((b'{"n":%d,"i":' % seq, part, b"}"))
            assert blob.removesuffix(TAIL) in payload
    other_request = bytes(bytearray(part))
    assert other_request is not part
    assert parts.compressed("key-a", DEFLATE_WINDOW_BITS, other_request) is blob
    assert parts.compressed("key-b", DEFLATE_WINDOW_BITS, part) is not blob
    assert parts.size == 2 * (len(part) + len(blob))


@pytest.mark.parametrize("no_takeover", [False, True])
def test_what_follows_a_splice_refers_to_nothing_the_client_cannot_see(no_takeover: bool) -> None:
    """WS-19: after a spliced snapshot, a message repeating what the compressor saw before the
    splice (with takeover: the client's window holds the splice in between) or within it (no
    takeover: the client inflates each message alone) still inflates to its own bytes."""
    deflater = Deflater(15, no_takeover, Parts())
    text, part = _TEXTS[1], _PARTS_POOL[1]
    sent = [(deflater.frame(text), text)]  # the compressor's history: text
    pieces = (b'{"a":', part, text)  # a large last piece goes through the compressor
    sent.append((deflater.frame_pieces(pieces), b"".join(pieces)))
    sent.append((deflater.frame(text), text))  # repeats both: only a reset makes it right
    inflate = zlib.decompressobj(-15)
    for (_, payload), expected in sent:
        if no_takeover:
            inflate = zlib.decompressobj(-15)
        assert trickle(inflate, payload + TAIL) == expected


@pytest.mark.parametrize("no_takeover", [False, True])
def test_the_compressor_refers_back_at_most_8_kib_whatever_was_negotiated(
    no_takeover: bool,
) -> None:
    """WS-19: on a socket that negotiated the full 32 KiB window, the server's messages (plain
    and spliced) never refer farther back than 2**13 bytes: a client inflating them with an
    8 KiB window gets every message's own bytes. Each message repeats, 9 KiB on, what it held
    before, which a 32 KiB compressor would reach back for."""
    block = random.Random(7).randbytes(9 * 1024)
    deflater = Deflater(15, no_takeover, Parts())
    sent = [(deflater.frame(block + block), block + block)]
    pieces = (b'{"a":', block + b"." + block, b"}")  # a part compressed once, spliced
    sent.append((deflater.frame_pieces(pieces), b"".join(pieces)))
    sent.append((deflater.frame(block), block))  # 18 KiB after the same bytes in the window
    inflate = zlib.decompressobj(-DEFLATE_WINDOW_BITS)
    for (_, payload), expected in sent:
        if no_takeover:
            inflate = zlib.decompressobj(-DEFLATE_WINDOW_BITS)
        assert trickle(inflate, payload + TAIL) == expected
