"""COMPAT-10 on Postgres: two ``rollout serve`` processes on one real database stand for two
nodes. A ``store: true`` response answered by one is continued by the other from the client's
whole history (no ``previous_response_id``): the index entry written beside the record is
found by one query, the response is served on the store path, and its input items are the
request's whole input."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from tests.store._procs import ServeProcess

Serve = Callable[..., Awaitable[ServeProcess]]


async def _request(server: ServeProcess, method: str, path: str, body: Any = None) -> Any:
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, server.base + path, json=body) as resp,
    ):
        answer = await resp.json()
        assert resp.status == 200, answer
    return answer


async def test_a_resend_on_the_other_process_continues_from_the_store(
    postgres_url: str, serve: Serve
) -> None:
    """COMPAT-10: node B continues node A's stored response (``resend.shared_hit``, the store
    path); A looked up nothing."""
    a, b = await serve(postgres_url), await serve(postgres_url)
    history: list[Any] = [{"role": "user", "content": "remember: blue"}]
    first = await _request(a, "POST", "/v1/responses", {"model": "sim", "input": history})
    history += [*first["output"], {"role": "user", "content": "what did I say?"}]
    second = await _request(b, "POST", "/v1/responses", {"model": "sim", "input": history})
    assert second["status"] == "completed" and second["previous_response_id"] is None
    items = await _request(b, "GET", f"/v1/responses/{second['id']}/input_items?order=asc")
    assert [item["type"] for item in items["data"]] == ["message"] * 3  # the whole input
    counters = (await _request(b, "GET", "/debug/stats"))["counters"]
    assert counters.get("resend.shared_hit") == 1
    assert counters.get("create.store_hydrate") == 1
    assert counters.get("create.resent") == 1
    assert "resend.shared_hit" not in (await _request(a, "GET", "/debug/stats"))["counters"]
