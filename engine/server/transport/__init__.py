"""Transports: the aiohttp app, WebSocket, HTTP, and what every request
passes (identity, rate limits, idempotency, headers)."""
