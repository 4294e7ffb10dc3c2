"""STORE-6: ``kill -9`` in the middle of several chains (HTTP and WebSocket; SQLite, Redis and
Postgres); after a restart every acknowledged response is there and can be continued."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import aiohttp

from tests.store._chain import Chain, body, fork_from, http_create, ws_create
from tests.store._procs import ServeProcess

Serve = Callable[..., Awaitable[ServeProcess]]
ACKS_BEFORE_KILL = 24
LOST = (aiohttp.ClientError, ConnectionError, TimeoutError)


async def _drive(server: ServeProcess, chain: Chain, over_ws: bool, acked: asyncio.Event) -> None:
    """Turn after turn until the server dies under it; a response counts once its terminal
    frame arrived (that is the acknowledgement the promise is about)."""
    async with aiohttp.ClientSession() as http:
        try:
            if over_ws:
                async with http.ws_connect(server.ws_url) as ws:
                    while True:
                        chain.accept(await ws_create(ws, body(chain.last, len(chain.acked))))
                        _count(acked)
            while True:
                reply = await http_create(http, server.base, body(chain.last, len(chain.acked)))
                chain.accept(reply)
                _count(acked)
        except LOST:
            return


_ACKS = [0]


def _count(acked: asyncio.Event) -> None:
    _ACKS[0] += 1
    if _ACKS[0] >= ACKS_BEFORE_KILL:
        acked.set()


async def test_kill9_loses_nothing_acknowledged(store_url: str, serve: Serve) -> None:
    _ACKS[0] = 0
    server = await serve(store_url, "--tps", "3000")  # paced: requests are in flight at the kill
    chains = [Chain() for _ in range(4)]
    enough = asyncio.Event()
    drivers = [
        asyncio.create_task(_drive(server, chain, over_ws=i % 2 == 1, acked=enough))
        for i, chain in enumerate(chains)
    ]
    await asyncio.wait_for(enough.wait(), 60)
    await server.kill9()
    await asyncio.wait_for(asyncio.gather(*drivers), 30)
    acked = [response for chain in chains for response in chain.acked]
    assert len(acked) >= ACKS_BEFORE_KILL
    await server.start()
    async with aiohttp.ClientSession() as http:
        missing = []
        for response in acked:
            async with http.get(f"{server.base}/v1/responses/{response['id']}") as resp:
                if resp.status != 200:
                    missing.append(response["id"])
        assert missing == [], f"{len(missing)} of {len(acked)} acknowledged responses lost"
        print(f"kill -9 ({store_url.split(':')[0]}): {len(acked)} acknowledged, 0 lost")
        for response in acked:
            await fork_from(http, server.base, response)
        for chain in chains:  # and each chain goes on from where it was cut
            chain.accept(await http_create(http, server.base, body(chain.last, len(chain.acked))))
