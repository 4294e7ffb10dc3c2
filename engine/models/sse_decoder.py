"""Incremental Server-Sent Events decoder for upstream streams (sans-I/O).

Fed raw bytes in whatever chunks the socket delivers; returns complete events. We split lines
ourselves instead of using aiohttp's ``readline`` because that caps a line at 128 KiB, and a
Responses ``response.completed`` event (the whole response echoed back) can be larger.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_EVENT_BYTES = 16 * 1024 * 1024  # one event larger than this is a broken upstream


class SseTooLarge(Exception):
    """An event grew past ``MAX_EVENT_BYTES`` without ending."""


@dataclass(frozen=True, slots=True)
class SseEvent:
    event: str | None
    data: str


class SseDecoder:
    """Splits a byte stream into SSE events (``event:`` and multi-line ``data:`` fields)."""

    __slots__ = ("_buffer", "_data", "_event", "_size")

    def __init__(self) -> None:
        self._buffer = b""
        self._event: str | None = None
        self._data: list[str] = []
        self._size = 0

    def feed(self, chunk: bytes) -> list[SseEvent]:
        self._buffer += chunk
        if len(self._buffer) + self._size > MAX_EVENT_BYTES:
            raise SseTooLarge
        out: list[SseEvent] = []
        while True:
            end = self._buffer.find(b"\n")
            if end < 0:
                return out
            line = self._buffer[:end].rstrip(b"\r").decode("utf-8", errors="replace")
            self._buffer = self._buffer[end + 1 :]
            event = self._line(line)
            if event is not None:
                out.append(event)

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
        out = self.feed(b"\n") if self._buffer else []
        last = self._dispatch()
        return [*out, last] if last is not None else out
