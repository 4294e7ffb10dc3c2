"""The token-in/token-out model servers, one class per server (SPEC: TOK-2)."""
