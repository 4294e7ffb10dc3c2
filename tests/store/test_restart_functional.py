"""STORE-6, STORE-10: a stored response survives a restart of ``rollout serve`` (SQLite, Redis
and Postgres) and is continued over HTTP and WebSocket afterwards."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import aiohttp

from tests.store._chain import Chain, body, http_create, ws_create
from tests.store._procs import ServeProcess

Serve = Callable[..., Awaitable[ServeProcess]]


async def test_stored_chain_survives_restart(store_url: str, serve: Serve) -> None:
    server = await serve(store_url)
    chain = Chain()
    async with aiohttp.ClientSession() as http:
        for step in range(4):
            chain.accept(await http_create(http, server.base, body(chain.last, step)))
        async with http.ws_connect(server.ws_url) as ws:
            chain.accept(await ws_create(ws, body(chain.last, 4)))
        await server.stop()
        await server.start()
        for response in chain.acked:  # every one of them, not only the last
            async with http.get(f"{server.base}/v1/responses/{response['id']}") as resp:
                assert resp.status == 200
                assert (await resp.json())["output"] == response["output"]
        chain.accept(await http_create(http, server.base, body(chain.last, 5)))
        async with http.ws_connect(server.ws_url) as ws:
            chain.accept(await ws_create(ws, body(chain.last, 6)))
            chain.accept(await ws_create(ws, body(chain.last, 7)))  # then the connection cache
        async with http.get(f"{server.base}/debug/stats") as resp:
            counters = (await resp.json())["counters"]
        # After the restart the HTTP continuation hydrates from the store; the new connection
        # then continues from that response of this process through its hydration cache (HYD-1).
        assert counters["create.store_hydrate"] == counters["create.hydrated"] == 1
