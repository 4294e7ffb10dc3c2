"""Python clients for the rollout engine, built on ``protocol`` only (never on ``engine``).

* ``AppendClient``: experimental append mode over WebSocket (one response per rollout).
* ``CompatClient``: standard WebSocket mode (``previous_response_id`` + only new items).
* ``HttpClient``: HTTP/SSE, with ``previous_response_id`` or fully stateless.
* ``ToolRegistry``: tool definitions and safe execution, shared by all three.
"""

from clients.exceptions import (
    ApiError,
    AppendRejected,
    ClientError,
    ConnectionFailed,
    ProtocolViolation,
    RolloutFailed,
)
from clients.http import HttpClient
from clients.loop import Hooks, RolloutClient, RolloutResult, ToolCallRecord, TurnEnd
from clients.toolbox import ToolError, ToolOutcome, ToolRegistry
from clients.ws_append import AppendClient
from clients.ws_compat import CompatClient

__all__ = [
    "ApiError",
    "AppendClient",
    "AppendRejected",
    "ClientError",
    "CompatClient",
    "ConnectionFailed",
    "Hooks",
    "HttpClient",
    "ProtocolViolation",
    "RolloutClient",
    "RolloutFailed",
    "RolloutResult",
    "ToolCallRecord",
    "ToolError",
    "ToolOutcome",
    "ToolRegistry",
    "TurnEnd",
]
