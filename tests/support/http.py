"""Plain HTTP requests to a live server (aiohttp's client)."""

from __future__ import annotations

from typing import Any

import aiohttp

from tests.support.server import LiveServer


async def post(server: LiveServer, **body: Any) -> tuple[int, dict[str, Any]]:
    """``POST /v1/responses`` with this JSON body: the status and the decoded JSON answer."""
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{server.base_url}/responses", json=body) as resp,
    ):
        answer: dict[str, Any] = await resp.json()
        return resp.status, answer
