"""Transports only: the aiohttp app, the WebSocket driver, HTTP routes and the CLI."""
