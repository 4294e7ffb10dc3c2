"""RFC 6455 edges on the API's WebSocket, driven byte by byte from a raw socket client (WS-17,
WS-18, LEN-5): what aiohttp checks (control frames, fragmentation, close codes, reserved
bits and opcodes) and what the server adds (invalid UTF-8 in a text message fails the
connection with 1007, §8.1, whether the bad bytes are in one frame or split across several)."""

from __future__ import annotations

import asyncio
import base64
import os
import struct

import pytest

from tests.support.server import LiveServer

CLOSE, PING, PONG, TEXT, CONTINUATION = 0x8, 0x9, 0xA, 0x1, 0x0


def frame(
    opcode: int, payload: bytes, *, fin: bool = True, mask: bool = True, rsv: int = 0
) -> bytes:
    """One client frame (RFC 6455 §5.2), masked unless asked otherwise."""
    first = (0x80 if fin else 0) | rsv | opcode
    bit, n = (0x80 if mask else 0), len(payload)
    if n < 126:
        header = bytes((first, bit | n))
    elif n < 65536:
        header = bytes((first, bit | 126)) + struct.pack(">H", n)
    else:
        header = bytes((first, bit | 127)) + struct.pack(">Q", n)
    if not mask:
        return header + payload
    key = os.urandom(4)
    return header + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


def close_frame(code: int, reason: bytes = b"") -> bytes:
    return frame(CLOSE, struct.pack(">H", code) + reason)


class RawSocket:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, live: LiveServer) -> RawSocket:
        reader, writer = await asyncio.open_connection("127.0.0.1", live.port)
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write(
            f"GET /v1/responses HTTP/1.1\r\nHost: 127.0.0.1:{live.port}\r\n"
            f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101"), head
        return cls(reader, writer)

    async def send(self, *frames: bytes) -> None:
        self.writer.write(b"".join(frames))
        await self.writer.drain()

    async def receive(self) -> tuple[int, bytes]:
        """The next server frame: (opcode, payload). Server frames are never masked."""
        head = await asyncio.wait_for(self.reader.readexactly(2), 10)
        assert head[1] & 0x80 == 0, "a server frame is never masked (§5.1)"
        n = head[1] & 0x7F
        if n == 126:
            n = struct.unpack(">H", await self.reader.readexactly(2))[0]
        elif n == 127:
            n = struct.unpack(">Q", await self.reader.readexactly(8))[0]
        return head[0] & 0x0F, await self.reader.readexactly(n)

    async def close_code(self) -> int:
        """Skips data frames up to the server's close frame; its status code."""
        while True:
            opcode, payload = await self.receive()
            if opcode == CLOSE:
                assert len(payload) >= 2
                code: int = struct.unpack(">H", payload[:2])[0]
                return code

    async def still_open(self) -> None:
        """A ping is answered: the connection survived."""
        await self.send(frame(PING, b"alive?"))
        while (got := await self.receive())[0] != PONG:
            assert got[0] != CLOSE, got
        assert got[1] == b"alive?"

    def close(self) -> None:
        self.writer.close()


INVALID_UTF8 = {
    "a lone 0xff": [frame(TEXT, b"\xff")],
    "inside a JSON string": [frame(TEXT, b'{"type":"response.create","input":"\xc3\x28"}')],
    "an overlong encoding": [frame(TEXT, b'{"type":"\xc0\xaf"}')],
    "a UTF-16 surrogate": [frame(TEXT, b'{"type":"\xed\xa0\x80"}')],
    "a sequence split across fragments": [
        frame(TEXT, b'{"type":"\xe2\x82', fin=False),
        frame(CONTINUATION, b'\x28"}'),
    ],
}


@pytest.mark.parametrize("frames", INVALID_UTF8.values(), ids=list(INVALID_UTF8))
async def test_invalid_utf8_fails_the_connection_with_1007(
    server: LiveServer, frames: list[bytes]
) -> None:
    """WS-17 (RFC 6455 §8.1): not an error event on an open socket, a 1007 close."""
    sock = await RawSocket.open(server)
    try:
        await sock.send(*frames)
        assert await sock.close_code() == 1007
    finally:
        sock.close()


async def test_valid_utf8_split_across_fragments_is_one_message(server: LiveServer) -> None:
    """A multi-byte character split between fragments is valid: the message is decoded whole
    (here an unknown event type: an error event) and the socket stays open."""
    sock = await RawSocket.open(server)
    try:
        await sock.send(
            frame(TEXT, b'{"type":"\xe2\x82', fin=False), frame(CONTINUATION, b'\xac"}')
        )
        opcode, payload = await sock.receive()
        assert opcode == TEXT and b'"type":"error"' in payload
        await sock.still_open()
    finally:
        sock.close()


async def test_control_frames(server: LiveServer) -> None:
    """A ping of 125 bytes is answered with the same payload, also between the fragments of a
    message (§5.4, §5.5.2); the message is then read whole."""
    sock = await RawSocket.open(server)
    try:
        await sock.send(frame(PING, b"p" * 125))
        assert await sock.receive() == (PONG, b"p" * 125)
        await sock.send(
            frame(TEXT, b'{"type":', fin=False), frame(PING, b"mid"), frame(CONTINUATION, b'"x"}')
        )
        assert await sock.receive() == (PONG, b"mid")
        opcode, payload = await sock.receive()
        assert opcode == TEXT and b'"type":"error"' in payload
        await sock.still_open()
    finally:
        sock.close()


PROTOCOL_ERRORS = {
    "a ping of 126 bytes": [frame(PING, b"p" * 126)],
    "a fragmented ping": [frame(PING, b"p", fin=False)],
    "a continuation with nothing to continue": [frame(CONTINUATION, b"x")],
    "a new text frame inside a fragmented message": [
        frame(TEXT, b"{", fin=False),
        frame(TEXT, b"{}"),
    ],
    "RSV1 without an extension": [frame(TEXT, b"{}", rsv=0x40)],
    "reserved data opcode 0x3": [frame(0x3, b"x")],
    "reserved control opcode 0xB": [frame(0xB, b"x")],
    "close code 1005 on the wire": [close_frame(1005)],
    "close code 999": [close_frame(999)],
    "a one-byte close payload": [frame(CLOSE, b"\x03")],
}


@pytest.mark.parametrize("frames", PROTOCOL_ERRORS.values(), ids=list(PROTOCOL_ERRORS))
async def test_protocol_errors_close_with_1002(server: LiveServer, frames: list[bytes]) -> None:
    """WS-18: aiohttp fails these with 1002 (protocol error, §7.4.1); pinned here."""
    sock = await RawSocket.open(server)
    try:
        await sock.send(*frames)
        assert await sock.close_code() == 1002
    finally:
        sock.close()


async def test_close_handshake(server: LiveServer) -> None:
    """WS-18: a client's close 1000 is answered with 1000; a close whose reason is not UTF-8
    with 1007."""
    for sent, answer in ((close_frame(1000, b"bye"), 1000), (close_frame(1000, b"\xff"), 1007)):
        sock = await RawSocket.open(server)
        try:
            await sock.send(sent)
            assert await sock.close_code() == answer
        finally:
            sock.close()


async def test_unmasked_client_frame_is_accepted(server: LiveServer) -> None:
    """LEN-5: RFC 6455 §5.1 says a server MUST close on an unmasked client frame; aiohttp
    reads it as a masked one would be read. A documented leniency, pinned so that a change is
    seen."""
    sock = await RawSocket.open(server)
    try:
        await sock.send(frame(TEXT, b"{}", mask=False))
        opcode, payload = await sock.receive()
        assert opcode == TEXT and b'"type":"error"' in payload
        await sock.still_open()
    finally:
        sock.close()
