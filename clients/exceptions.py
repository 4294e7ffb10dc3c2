"""Client-side exceptions: one base class, split by who is at fault.

Callers usually catch ``ClientError``; the subclasses say whether the server refused the request
(``ApiError``), the model run ended badly (``RolloutFailed``), the peer could not be reached or went
away (``ConnectionFailed``) or the server broke the protocol (``ProtocolViolation``).
"""

from __future__ import annotations

from protocol.events import ErrorBody, ErrorEvent
from protocol.response import Response


class ClientError(Exception):
    """Base of every error the clients raise."""


class ApiError(ClientError):
    """The server answered with an error envelope (WebSocket ``error`` event or HTTP 4xx/5xx)."""

    def __init__(
        self, status: int, code: str | None, message: str, param: str | None, error_type: str
    ) -> None:
        where = f" (param: {param})" if param else ""
        super().__init__(f"{status} {code or error_type}: {message}{where}")
        self.status = status
        self.code = code
        self.message = message
        self.param = param
        self.error_type = error_type

    @classmethod
    def from_body(cls, status: int, body: ErrorBody) -> ApiError:
        return cls(status, body.code, body.message, body.param, body.type)

    @classmethod
    def from_event(cls, event: ErrorEvent) -> ApiError:
        return cls.from_body(event.status, event.error)


class AppendRejected(ApiError):
    """``response.inject.failed``: the server refused tool outputs for a suspended response."""


class RolloutFailed(ClientError):
    """The response ended ``failed`` or ``incomplete``; the final snapshot is kept on it."""

    def __init__(self, response: Response) -> None:
        if response.error is not None:
            detail = f"{response.error.code}: {response.error.message}"
        elif response.incomplete_details is not None:
            detail = f"incomplete: {response.incomplete_details.reason}"
        else:
            detail = response.status
        super().__init__(f"response {response.id} ended {response.status} ({detail})")
        self.response = response


class ConnectionFailed(ClientError):
    """The server could not be reached, or the connection dropped mid-rollout."""


class ProtocolViolation(ClientError):
    """The server sent something the protocol does not allow (a server bug, not a user error)."""
