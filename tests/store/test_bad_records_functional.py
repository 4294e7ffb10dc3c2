"""STORE-9 on the wire: a response too large to store and a corrupt stored record are clean,
request-scoped errors; the socket and the server carry on."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from engine.store.embedded.sqlite import SqliteStore
from tests.store._chain import http_create, ws_create
from tests.support.server import LiveServer, start_server


@pytest.fixture
async def small_store_server(tmp_path: Path) -> AsyncIterator[LiveServer]:
    live = await start_server(store=SqliteStore(tmp_path / "s.db", max_record_bytes=4096))
    try:
        yield live
    finally:
        await live.runner.cleanup()


async def test_oversized_response_is_refused_and_the_socket_lives(
    small_store_server: LiveServer,
) -> None:
    big = "lorem ipsum " * 600  # ~7 KB of input: its record is over the 4 KB limit
    base = small_store_server.base_url.removesuffix("/v1")
    async with aiohttp.ClientSession() as http:
        reply = await http_create(http, base, {"input": big})
        assert (reply.status, reply.code) == (400, "store_record_too_large")
        assert reply.error is not None and reply.error["param"] == "store"
        async with http.ws_connect(small_store_server.ws_url) as ws:
            reply = await ws_create(ws, {"input": big})
            assert (reply.status, reply.code) == (400, "store_record_too_large")
            unstored = await ws_create(ws, {"input": big, "store": False})
            assert unstored.response is not None and unstored.response["status"] == "completed"
            small = await ws_create(ws, {"input": "hello"})
            assert small.response is not None
        async with http.get(f"{base}/v1/responses/{small.response['id']}") as resp:
            assert resp.status == 200
        await small_store_server.engine.post.stop()  # drained: the stages are in the metrics
        async with http.get(f"{base}/metrics") as resp:
            assert 'rollout_stage_seconds_count{stage="store"}' in await resp.text()  # OBS-1


async def test_corrupt_record_is_a_clean_error(small_store_server: LiveServer) -> None:
    await small_store_server.engine.store._write("resp_broken", b"\xc1\xc1", [], False, None)
    base = small_store_server.base_url.removesuffix("/v1")
    async with aiohttp.ClientSession() as http:
        for path in ("", "/input_items"):
            async with http.get(f"{base}/v1/responses/resp_broken{path}") as resp:
                assert resp.status == 500
                error = (await resp.json())["error"]
                assert error["code"] == "store_record_corrupt"
                assert "\\xc1" not in error["message"]  # no internal detail on the wire
        reply = await http_create(http, base, {"input": "x", "previous_response_id": "resp_broken"})
        assert (reply.status, reply.code) == (500, "store_record_corrupt")
        assert reply.error is not None and reply.error["param"] == "previous_response_id"
        async with http.ws_connect(small_store_server.ws_url) as ws:
            reply = await ws_create(ws, {"input": "x", "previous_response_id": "resp_broken"})
            assert reply.code == "store_record_corrupt"
            assert (await ws_create(ws, {"input": "still here"})).response is not None
        async with http.delete(f"{base}/v1/responses/resp_broken") as resp:
            assert resp.status == 200  # a corrupt record can still be deleted
