"""Wire helpers shared by every client: event decoding (decoder built once), encoding, URLs."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

import msgspec

from clients.exceptions import ProtocolViolation
from protocol.events import ServerEvent

_DECODER = msgspec.json.Decoder(ServerEvent)
_ENCODER = msgspec.json.Encoder()
_TYPE_ONLY = msgspec.json.Decoder(dict[str, Any])
KNOWN_TYPES = frozenset(cls.__struct_config__.tag for cls in ServerEvent.__args__)


def decode_event(raw: bytes | str) -> ServerEvent | None:
    """One server event, typed. Unknown event types return None (clients stay forward compatible);
    a known type with a malformed body is a server bug and raises ``ProtocolViolation``."""
    try:
        return _DECODER.decode(raw)
    except msgspec.ValidationError as exc:
        kind = _event_type(raw)
        if kind is not None and kind not in KNOWN_TYPES:
            return None
        raise ProtocolViolation(f"malformed {kind or 'server'} event: {exc}") from None
    except msgspec.DecodeError as exc:
        raise ProtocolViolation(f"server sent invalid JSON: {exc}") from None


def _event_type(raw: bytes | str) -> str | None:
    try:
        kind = _TYPE_ONLY.decode(raw).get("type")
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return kind if isinstance(kind, str) else None


def encode(payload: Any) -> bytes:
    return _ENCODER.encode(payload)


def to_builtins(obj: Any) -> Any:
    """A protocol struct as plain JSON values (to resend output items as input)."""
    return msgspec.to_builtins(obj)


def ws_url(base_url: str) -> str:
    """``http://host:port/v1`` (an SDK-style base URL) -> ``ws://host:port/v1/responses``.

    A ``ws://`` or ``wss://`` URL is accepted too; ``/responses`` is added when missing."""
    parts = urlsplit(base_url)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    return urlunsplit(parts._replace(scheme=scheme, path=_responses_path(parts.path)))


def http_url(base_url: str) -> str:
    """``http://host:port/v1`` -> ``http://host:port/v1/responses`` (ws schemes mapped back)."""
    parts = urlsplit(base_url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    return urlunsplit(parts._replace(scheme=scheme, path=_responses_path(parts.path)))


def _responses_path(path: str) -> str:
    path = path.rstrip("/")
    return path if path.endswith("/responses") else f"{path}/responses"
