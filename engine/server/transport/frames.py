"""The server's WebSocket frames, plain and compressed (RFC 6455 §5.2, RFC 7692; SPEC WS-14,
WS-19): headers built without a library's per-frame objects, and the compressing half of a
negotiated permessage-deflate, which compresses a snapshot's unchanging parts only once."""

from __future__ import annotations

import struct
import zlib


def frame_header(n: int) -> bytes:
    """The header of an unmasked, final, uncompressed text frame of ``n`` payload bytes
    (RFC 6455 §5.2): the server's frame shape."""
    if n < 126:
        return bytes((0x81, n))
    if n < 65536:
        return b"\x81\x7e" + n.to_bytes(2, "big")
    return b"\x81\x7f" + n.to_bytes(8, "big")


def text_frame(data: bytes) -> bytes:
    """A whole text frame: header and payload."""
    return frame_header(len(data)) + data


COPY_LIMIT = 4096  # larger payloads go out as their own buffer: no copy to prepend the header
# WS-19: on a permessage-deflate socket, a message this big or bigger goes out compressed; a
# smaller one (a delta, a short item event) uncompressed, RSV1 clear, as RFC 7692 §6 allows.
DEFLATE_MIN_BYTES = 256
# A snapshot's unchanging part this big is compressed once and spliced; a dynamic piece smaller
# than this goes into the stream as a stored block (RFC 1951 §3.2.4), with no deflate call.
COMPRESS_ONCE_MIN_BYTES = 1024
# The socket's compressor keeps a window of at most 2**13 = 8 KiB, whatever the client allows
# (RFC 7692 §7.1.2: a server may use less than the negotiated window), and a 2 K-entry hash
# (memLevel 4): its state is ~40 KiB instead of zlib's default ~260 KiB per socket, and the full
# flush after a splice clears 4 KiB of hash, not 64 KiB; the bytes sent per turn are the same
# (a Codex turn's parts compress equally at 13 and 15 bits, 12 loses ~10%). WS-19.
DEFLATE_WINDOW_BITS = 13
DEFLATE_MEM_LEVEL = 4
_DEFLATE_TAIL = b"\x00\x00\xff\xff"  # what a sync flush ends with; RFC 7692 §7.2.1 drops it
_EMPTY_STORED = b"\x00" + _DEFLATE_TAIL  # an empty stored block: the sync flush's own bytes


def deflate_frame_header(n: int) -> bytes:
    """``frame_header`` with RSV1 set: a compressed message (RFC 7692 §6)."""
    header = frame_header(n)
    return bytes((header[0] | 0x40,)) + header[1:]


def stored(piece: bytes) -> bytes:
    """``piece`` (under 64 KiB) as one non-final stored block, at a byte boundary: the block
    header byte, LEN and its complement, the bytes as they are (RFC 1951 §3.2.4)."""
    n = len(piece)
    return b"\x00" + struct.pack("<HH", n, n ^ 0xFFFF) + piece


class Parts:
    """The unchanging parts of lifecycle snapshots (their instructions' and tools' JSON,
    CODEC-6), each compressed once per owner and window size and shared by that owner's
    sockets (WS-19): a raw deflate stream of its own, ending in a sync flush, so it refers to
    nothing before it and can be spliced into any message. Keyed by owner too, so no key's
    timing shows whether another key sent the same text. Bounded in bytes (the part, held in
    the key, and its compressed form), oldest dropped first."""

    __slots__ = ("_limit", "_parts", "_size")

    LEVEL = 6  # once per part: zlib's default ratio is worth its cost here

    def __init__(self, limit_bytes: int = 8 * 1024 * 1024) -> None:
        self._limit = limit_bytes
        self._parts: dict[tuple[object, int, bytes], bytes] = {}
        self._size = 0

    @property
    def size(self) -> int:
        """Bytes held: every part and its compressed stream."""
        return self._size

    def compressed(self, owner: object, window_bits: int, part: bytes) -> bytes:
        key = (owner, window_bits, part)
        blob = self._parts.get(key)
        if blob is not None:
            return blob
        z = zlib.compressobj(self.LEVEL, zlib.DEFLATED, -window_bits)
        blob = z.compress(part) + z.flush(zlib.Z_SYNC_FLUSH)
        cost = len(part) + len(blob)
        while self._parts and self._size + cost > self._limit:
            old = next(iter(self._parts))
            self._size -= len(old[2]) + len(self._parts.pop(old))
        if cost <= self._limit:
            self._parts[key] = blob
            self._size += cost
        return blob


PARTS = Parts()


class Deflater:
    """The compressing half of a negotiated permessage-deflate (RFC 7692): raw deflate at the
    negotiated window, the sliding window kept across messages unless the client asked
    ``server_no_context_takeover`` (then each message stands alone). Built once per socket;
    only messages of ``DEFLATE_MIN_BYTES`` or more come here (WS-19).

    A snapshot is not compressed again: its unchanging parts are spliced in as ``Parts``
    compressed them once, its small dynamic pieces go in as stored blocks, a large one (the
    output) through the socket's compressor. Anything spliced is in the client's window but
    not in the compressor's, so the compressor's next use first flushes whole
    (``Z_FULL_FLUSH``: what follows refers to nothing before it). Inflated, every message is
    the same bytes."""

    __slots__ = ("_bits", "_flush", "_in_step", "_owner", "_parts", "_z")

    def __init__(
        self, window_bits: int, no_takeover: bool, parts: Parts = PARTS, owner: object = None
    ) -> None:
        bits = min(window_bits, DEFLATE_WINDOW_BITS)  # never farther back than 8 KiB
        self._z = zlib.compressobj(zlib.Z_BEST_SPEED, zlib.DEFLATED, -bits, DEFLATE_MEM_LEVEL)
        self._flush = zlib.Z_FULL_FLUSH if no_takeover else zlib.Z_SYNC_FLUSH
        self._bits = bits  # the parts it splices are compressed at this window too
        self._parts = parts
        self._owner = owner  # the socket's key: whose parts it may reuse
        # The client's window ends with what the compressor last compressed (nothing spliced
        # since): only then may the compressor refer back.
        self._in_step = True

    def frame(self, data: bytes) -> tuple[bytes, bytes]:
        """(header, payload) of the compressed text frame of ``data``."""
        z = self._z
        if self._in_step:
            payload = z.compress(data) + z.flush(self._flush)
        else:
            payload = z.flush(zlib.Z_FULL_FLUSH) + z.compress(data) + z.flush(self._flush)
            self._in_step = True
        payload = payload.removesuffix(_DEFLATE_TAIL)
        return deflate_frame_header(len(payload)), payload

    def frame_pieces(self, pieces: tuple[bytes, ...]) -> tuple[bytes, bytes]:
        """(header, payload) of the compressed text frame of ``b"".join(pieces)``, whose odd
        pieces are unchanging parts (``protocol.codec.snapshot_pieces``)."""
        out: list[bytes] = []
        for i, piece in enumerate(pieces):
            if len(piece) < COMPRESS_ONCE_MIN_BYTES:
                out.append(stored(piece))
                self._in_step = False
            elif i % 2:
                out.append(self._parts.compressed(self._owner, self._bits, piece))
                self._in_step = False
            else:
                out.append(self._deflated(piece))
        if not out[-1].endswith(_DEFLATE_TAIL):
            out.append(_EMPTY_STORED)
        if self._flush == zlib.Z_FULL_FLUSH:  # no context takeover:
            self._in_step = False  # the next message must not refer to this one
        payload = b"".join(out).removesuffix(_DEFLATE_TAIL)
        return deflate_frame_header(len(payload)), payload

    def _deflated(self, piece: bytes) -> bytes:
        """A large dynamic piece through the socket's compressor, ending byte-aligned."""
        z = self._z
        reset = b"" if self._in_step else z.flush(zlib.Z_FULL_FLUSH)
        self._in_step = True
        return reset + z.compress(piece) + z.flush(zlib.Z_SYNC_FLUSH)
