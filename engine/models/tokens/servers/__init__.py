"""The token-in/token-out model servers, one class per server (SPEC: TOK-2): a route's ``api``
names one here. Another server is one module with a ``TokenServer`` subclass (its path, body
fields, chunk reader and options) and one line below."""

from __future__ import annotations

from engine.models.tokens.registry import Registry
from engine.models.tokens.servers.base import TokenServer

SERVERS: Registry[TokenServer] = Registry(
    TokenServer,
    {
        "vllm": "engine.models.tokens.servers.vllm:VllmServer",
        "sglang": "engine.models.tokens.servers.sglang:SglangServer",
        "llamacpp": "engine.models.tokens.servers.llamacpp:LlamacppServer",
    },
)
