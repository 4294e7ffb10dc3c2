"""One error tree for everything that can reach the wire (SPEC: ERR-1..ERR-4).

Each error carries the HTTP status it maps to, a stable machine-readable ``code``, an OpenAI
error ``type`` and, when a single field is at fault, ``param`` (a JSON path such as
``input[2].call_id``). Messages are written for API users; internal exception text is never put
in one.
"""

from __future__ import annotations

from typing import ClassVar


class ProtocolError(Exception):
    """Base of every error that is reported to a client."""

    status: ClassVar[int] = 400
    error_type: ClassVar[str] = "invalid_request_error"

    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param

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
