"""One error tree for everything that can reach the wire (SPEC: ERR-1..ERR-4).

Each error carries the HTTP status it maps to, a stable machine-readable ``code``, an OpenAI
error ``type`` and, when a single field is at fault, ``param`` (a JSON path such as
``input[2].call_id``). Messages are written for API users; internal exception text is never put
in one.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

import msgspec


class ProtocolError(Exception):
    """Base of every error that is reported to a client."""

    status: ClassVar[int] = 400
    error_type: ClassVar[str] = "invalid_request_error"
    # Headers the answer carries besides the body: on HTTP as headers, on the WebSocket in the
    # error event's ``headers`` (a 429's rate-limit figures, RATE-5).
    headers: dict[str, str] | None = None

    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        # Response headers that go with this error: HTTP answers carry them as headers, WebSocket
        # error frames as a `headers` object, which Codex reads like HTTP headers (CODEX-24),
        # e.g. `retry-after` and `x-ratelimit-*` on a 429.
        self.headers: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code!r}, {self.message!r}, param={self.param!r})"


class InvalidRequest(ProtocolError):
    """The client sent something wrong (local to the request; the connection stays usable)."""


class NotFound(ProtocolError):
    status = 404


class HttpStatusError(ProtocolError):
    """A transport-level rejection that keeps its own HTTP status (404, 405, 413 …)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(code, message, None)
        self.status = status  # type: ignore[misc]


class Conflict(ProtocolError):
    """The request conflicts with another one in progress (409, CONV-7)."""

    status = 409


class Unauthorized(ProtocolError):
    status = 401


class Unavailable(ProtocolError):
    """The server cannot take this request now (over capacity, shutting down)."""

    status = 503
    error_type = "server_error"


class TooManyRequests(ProtocolError):
    status = 429
    error_type = "rate_limit_error"


class ServerError(ProtocolError):
    """A fault on our side. The message is generic by construction (ERR-3)."""

    status = 500
    error_type = "server_error"

    def __init__(
        self, code: str = "server_error", message: str | None = None, param: str | None = None
    ) -> None:
        super().__init__(code, message or "The server had an error processing your request.", param)


def previous_response_not_found(response_id: str) -> InvalidRequest:
    return InvalidRequest(
        "previous_response_not_found",
        f"Previous response with id '{response_id}' not found.",
        "previous_response_id",
    )


def response_not_found(response_id: str, param: str | None = None) -> NotFound:
    return NotFound("response_not_found", f"Response with id '{response_id}' not found.", param)


def conversation_not_found(conversation_id: str, param: str | None = None) -> NotFound:
    """An unknown conversation, or another key's: the same answer (CONV-2, OWN-2)."""
    return NotFound(
        "conversation_not_found", f"Conversation with id '{conversation_id}' not found.", param
    )


def conversation_locked(conversation_id: str, param: str | None = None) -> Conflict:
    """Another request is writing to the conversation (CONV-7)."""
    return Conflict(
        "conversation_locked",
        f"Another request is currently using conversation '{conversation_id}'. "
        "Retry once it has finished.",
        param,
    )


# --------------------------------------------------------------------------- schema errors
# msgspec's validation messages, translated into client errors whose ``param`` is the JSON path
# of the bad field (CODEC-3). Here, not in the codec, so that every protocol module can use it.

_PATH = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_VALUE = re.compile(r"Invalid (?:enum )?value ('.*')$")
_MISSING = re.compile(r"missing required field `(?P<field>[^`]+)`")


def _join_path(prefix: str, path: str) -> str | None:
    path = path.lstrip(".")
    if not prefix:
        return path or None
    if not path:
        return prefix
    return f"{prefix}{path}" if path.startswith("[") else f"{prefix}.{path}"


def validation_error(exc: msgspec.ValidationError, prefix: str = "") -> InvalidRequest:
    """Translate a msgspec validation error into a client error with a JSON-path ``param``."""
    text = str(exc)
    match = _PATH.search(text)
    raw_path = match.group("path") if match else ""
    detail = text[: match.start()] if match else text
    missing = _MISSING.search(detail)
    if missing:
        param = _join_path(prefix, f"{raw_path}.{missing.group('field')}")
        return InvalidRequest(
            "missing_required_parameter", f"Missing required parameter: '{param}'.", param
        )
    param = _join_path(prefix, raw_path)
    where = f" for '{param}'" if param else ""
    if detail.startswith("Expected"):
        wanted = detail[len("Expected ") :].replace("`", "")
        return InvalidRequest("invalid_type", f"Invalid type{where}: expected {wanted}.", param)
    value = _VALUE.search(detail)
    shown = f": {value.group(1)[:64]}" if value else ""
    return InvalidRequest("invalid_value", f"Invalid value{where}{shown}.", param)


def missing_parameter(param: str) -> InvalidRequest:
    return InvalidRequest(
        "missing_required_parameter", f"Missing required parameter: '{param}'.", param
    )


def invalid_value(value: object, param: str) -> InvalidRequest:
    shown = repr(value)[:64] if isinstance(value, str) else str(value)[:64]
    return InvalidRequest("invalid_value", f"Invalid value for '{param}': {shown}.", param)


def invalid_encrypted_content(item_id: str, param: str) -> InvalidRequest:
    """A sealed reasoning blob of ours that does not open (SEAL-7), named by its item."""
    return InvalidRequest(
        "invalid_encrypted_content",
        f"The encrypted content of reasoning item '{item_id[:64]}' could not be verified or "
        "decrypted (tampered, truncated, or sealed for another key or owner).",
        param,
    )


def require_fields(obj: dict[str, Any], fields: tuple[str, ...], where: str) -> None:
    """The fields an SDK model requires are present (else ``missing_required_parameter``)."""
    for name in fields:
        if name not in obj:
            raise missing_parameter(f"{where}.{name}")


def store_unavailable() -> Unavailable:
    """The response store cannot be reached; this request only, retry later (STORE-8)."""
    return Unavailable(
        "store_unavailable",
        "The response store is unavailable; retry shortly, or use store: false.",
        None,
    )


def store_write_lost() -> ServerError:
    """The model ran and was billed, and the store did not acknowledge the terminal write: a
    500, never a 503, which says nothing ran (RETRY-1, RETRY-2), so no balancer or SDK runs the
    request again."""
    return ServerError(
        "store_unavailable",
        "The response was generated but the response store did not acknowledge it; "
        "it was not stored.",
        None,
    )


def store_record_too_large(size: int, limit: int) -> InvalidRequest:
    """A ``store: true`` response too large to store (STORE-9)."""
    return InvalidRequest(
        "store_record_too_large",
        f"The response is too large to store ({size:,} bytes; the limit is {limit:,}); "
        "use store: false.",
        "store",
    )


def store_record_corrupt(response_id: str, param: str | None = None) -> ServerError:
    """A stored record that cannot be read back (STORE-9); never a crash."""
    return ServerError(
        "store_record_corrupt", f"The stored response '{response_id}' cannot be read.", param
    )


# Faults that name their own code (SPEC §12). ``response.failed`` can only carry
# ``server_error`` (the SDK's ``ResponseError.code`` is a closed enum), so the code leads the
# message ("upstream_token_mismatch: ..."), and a non-streaming HTTP answer carries it as its
# error ``code`` (TOK-33).
FAILURE_CODES = frozenset({"upstream_token_mismatch"})


def failure_message(code: str, message: str) -> str:
    return f"{code}: {message}"


def failure_code(message: str) -> str:
    """The code a ``response.failed`` message names, else ``server_error``."""
    code, sep, _ = message.partition(": ")
    return code if sep and code in FAILURE_CODES else "server_error"
