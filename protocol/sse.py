"""Server-Sent Events, both ways (SPEC: HTTP-3, UP-2): ``frame`` writes one event for the HTTP
streaming transport; ``SseDecoder`` reads a byte stream back into events, for the upstream
backends, the clients and the benchmark alike. Pure: bytes in, bytes or events out, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True, slots=True)
class SseEvent:
    event: str | None
    data: str


class SseDecoder:
    """Incremental SSE decoder: fed raw bytes in whatever chunks the socket delivers, returns the
    complete events (``event:`` and multi-line ``data:`` fields; comments and other fields are
    skipped). Any chunking of the same bytes gives the same events.

    Lines are split here, one ``split`` per chunk, instead of with a stream's ``readline``:
    aiohttp caps a line at 128 KiB, and a ``response.completed`` event (the whole response
    echoed back) can be larger."""

    __slots__ = ("_data", "_event", "_partial", "_size")

    def __init__(self) -> None:
        self._partial = b""  # the start of a line whose end has not arrived yet
        self._event: str | None = None
        self._data: list[str] = []
        self._size = 0

    def feed(self, chunk: bytes) -> list[SseEvent]:
        out: list[SseEvent] = []
        if b"\n" in chunk:
            *lines, self._partial = (self._partial + chunk).split(b"\n")
            for raw in lines:
                event = self._line(raw.removesuffix(b"\r").decode("utf-8", errors="replace"))
                if event is not None:
                    out.append(event)
        else:
            self._partial += chunk
        if len(self._partial) + self._size > MAX_EVENT_BYTES:
            raise SseTooLarge
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
        out = self.feed(b"\n") if self._partial else []
        last = self._dispatch()
        return [*out, last] if last is not None else out
