"""Server-Sent Events framing for the HTTP streaming transport (SPEC: HTTP-3)."""

from __future__ import annotations

from protocol.codec import encode
from protocol.events import ServerEvent

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
