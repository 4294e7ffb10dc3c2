"""Server-Sent Events, both ways (SPEC: HTTP-3, UP-2): ``frame`` writes one event for the HTTP
streaming transport; ``SseDecoder`` reads a byte stream back into events, for the upstream
backends, the clients and the benchmark alike. Pure: bytes in, bytes or events out, no I/O.
"""

from __future__ import annotations

import msgspec

from protocol.codec import encode
from protocol.events import ServerEvent

MAX_EVENT_BYTES = 16 * 1024 * 1024  # one event larger than this is a broken peer

_PREFIXES: dict[type, bytes] = {}


def _prefix(cls: type) -> bytes:
    prefix = _PREFIXES.get(cls)
    if prefix is None:
        tag = cls.__struct_config__.tag  # type: ignore[attr-defined]
        prefix = _PREFIXES[cls] = b"event: " + str(tag).encode() + b"\ndata: "
    return prefix


def frame(event: ServerEvent) -> bytes:
    """One SSE event: ``event: <type>`` then ``data: <json>`` then a blank line."""
    return _prefix(type(event)) + encode(event) + b"\n\n"


class SseTooLarge(Exception):
    """An event grew past ``MAX_EVENT_BYTES`` without ending."""


class SseEvent(msgspec.Struct, frozen=True, gc=False):
    """One event: its ``event:`` name (None without one) and its ``data:`` lines joined. A
    struct, not a dataclass: built once per upstream event (a frozen dataclass's init costs
    ~10x more)."""

    event: str | None
    data: str


class SseDecoder:
    """Incremental SSE decoder: fed raw bytes in whatever chunks the socket delivers, returns the
    complete events (``event:`` and multi-line ``data:`` fields; comments and other fields are
    skipped). Any chunking of the same bytes gives the same events.

    Lines are split here, not with a stream's ``readline``: aiohttp caps a line at 128 KiB, and
    a ``response.completed`` event (the whole response echoed back) can be larger.

    In bulk (UP-2): the bytes up to the chunk's last blank line are whole events, split at the
    blank lines in one call; the usual event, ``event: <type>`` then one ``data: <json>`` line,
    is read with two slices instead of line by line. Anything else (a carriage return,
    comments, several data lines, an event left open by the line path) takes the line path,
    whose results are the same."""

    __slots__ = ("_data", "_event", "_partial", "_size")

    def __init__(self) -> None:
        self._partial = b""  # bytes after the last blank line (or the last line end) read
        self._event: str | None = None
        self._data: list[str] = []
        self._size = 0

    def feed(self, chunk: bytes) -> list[SseEvent]:
        seen = len(self._partial)
        data = self._partial + chunk if seen else chunk
        # A line end may be "\r\n" (its "\r" maybe the last byte read), or an event is open
        if b"\r" in chunk or self._partial.endswith(b"\r") or self._data or self._event is not None:
            out = self._lines(data)
        else:
            end = data.rfind(b"\n\n", seen - 1 if seen else 0)
            if end < 0:
                self._partial, out = data, []
            else:
                out = self._blocks(data[:end])
                self._partial = data[end + 2 :]
        if len(self._partial) + self._size > MAX_EVENT_BYTES:
            raise SseTooLarge
        return out

    def _lines(self, data: bytes) -> list[SseEvent]:
        """Every complete line of ``data`` through ``_line``; keeps the incomplete last one."""
        out: list[SseEvent] = []
        *lines, self._partial = data.split(b"\n")
        for raw in lines:
            event = self._line(raw.removesuffix(b"\r").decode("utf-8", errors="replace"))
            if event is not None:
                out.append(event)
        return out

    def _blocks(self, data: bytes) -> list[SseEvent]:
        """Whole events: ``data`` is followed by a blank line and its every ``\\n\\n`` ends one
        (the decoder holds no open event: ``feed`` checked)."""
        out: list[SseEvent] = []
        for block in data.split(b"\n\n"):
            if block.startswith(b"event: "):
                nl = block.find(b"\n")
                if nl > 0 and block.startswith(b"data: ", nl + 1) and block.find(b"\n", nl + 1) < 0:
                    name = block[7:nl].decode("utf-8", errors="replace")
                    out.append(SseEvent(name, block[nl + 7 :].decode("utf-8", errors="replace")))
                    continue
            elif block.startswith(b"data: ") and b"\n" not in block:
                out.append(SseEvent(None, block[6:].decode("utf-8", errors="replace")))
                continue
            out.extend(self._lines(block + b"\n"))  # its lines, then the blank line
            if (event := self._dispatch()) is not None:
                out.append(event)
        self._partial = b""
        return out

    def _line(self, line: str) -> SseEvent | None:
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None  # comment / keep-alive
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
            self._size += len(value)
        elif name == "event":
            self._event = value
        return None

    def _dispatch(self) -> SseEvent | None:
        if not self._data:
            self._event = None
            return None
        event = SseEvent(self._event, "\n".join(self._data))
        self._event, self._data, self._size = None, [], 0
        return event

    def close(self) -> list[SseEvent]:
        """End of stream: a final event without its blank line still counts."""
        out = self._lines(self._partial + b"\n") if self._partial else []
        last = self._dispatch()
        return [*out, last] if last is not None else out
