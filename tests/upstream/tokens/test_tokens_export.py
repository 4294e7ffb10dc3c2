"""``rollout export`` (EXPORT-1..5): the trajectories a key owns, out of a real server fed by a
peer speaking a token API, through the real client, to JSONL and Parquet. A key gets only its
own chains, an operator key everyone's; every row is what ``GET /v1/responses/{id}/tokens``
serves for the id; a turn cut by ``max_output_tokens`` exports with finish ``length``; the
route's ``weights`` tag travels with each row."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pyarrow.parquet as pq
import pytest

from cli.main import main
from clients.exceptions import ApiError
from clients.export import JsonlWriter, ParquetWriter, export
from engine.core import Engine, EngineConfig
from engine.server.app import create_app
from engine.server.transport.server_config import ServerConfig
from engine.store import open_store
from tests.support.server import LiveServer, serve_app
from tests.support.tools import WEATHER
from tests.upstream.token_peer import TokenPeer, tokens_router

ALICE, BOB, OPERATOR = "sk-alice-0001", "sk-bob-0002", "sk-operator-0003"
WEIGHTS = "tiny-step-7"


async def start(peer: TokenPeer, tokenizer: Path, store: str) -> LiveServer:
    config = EngineConfig(tokens_per_second=0, default_model="model-a")
    router = tokens_router(peer, tokenizer, "vllm", weights=WEIGHTS)
    engine = Engine(config, router=router, store=open_store(store))
    keys = ServerConfig(api_keys=frozenset({ALICE, BOB}), admin_keys=frozenset({OPERATOR}))
    runner, port = await serve_app(create_app(engine, server=keys))
    return LiveServer(engine=engine, port=port, runner=runner)


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def create(http: aiohttp.ClientSession, url: str, key: str, **body: Any) -> str:
    body = {"model": "model-a", "tools": [WEATHER], **body}
    async with http.post(f"{url}/responses", json=body, headers=auth(key)) as resp:
        assert resp.status == 200, await resp.text()
        answer: dict[str, Any] = await resp.json()
    if "max_output_tokens" in body:
        assert answer["status"] == "incomplete", answer
    rid: str = answer["id"]
    return rid


async def tokens(http: aiohttp.ClientSession, url: str, key: str, rid: str) -> dict[str, Any]:
    async with http.get(f"{url}/responses/{rid}/tokens", headers=auth(key)) as resp:
        assert resp.status == 200, await resp.text()
        body: dict[str, Any] = await resp.json()
        return body


async def exported_jsonl(url: str, key: str, out: Path) -> dict[str, dict[str, Any]]:
    with open(out, "wb") as file:  # noqa: ASYNC230 - a local file the test reads back
        count = await export(url, key, JsonlWriter(file))
    with open(out, "rb") as file:  # noqa: ASYNC230
        rows = [msgspec.json.decode(line) for line in file]
    assert count == len(rows)
    return {row["id"]: row for row in rows}


async def test_a_key_exports_its_own_chains_and_an_operator_everyones(
    token_peer: TokenPeer, tokenizer_dir: Path, tmp_path: Path
) -> None:
    server = await start(token_peer, tokenizer_dir, f"sqlite:///{tmp_path / 'store.db'}")
    url = server.base_url
    try:
        async with aiohttp.ClientSession() as http:
            cut = await create(http, url, ALICE, input="Weather?", max_output_tokens=5)
            later = await create(http, url, ALICE, input="go on", previous_response_id=cut)
            other = await create(http, url, ALICE, input="Hello")
            bobs = await create(http, url, BOB, input="Weather in Oslo?")
            served = {rid: await tokens(http, url, ALICE, rid) for rid in (cut, later, other)}
            served[bobs] = await tokens(http, url, BOB, bobs)
        alice_rows = await exported_jsonl(url, ALICE, tmp_path / "alice.jsonl")
        assert set(alice_rows) == {cut, later, other}  # never Bob's
        for rid, row in alice_rows.items():
            assert row == served[rid]  # exactly what /tokens serves
            assert row["weights"] == WEIGHTS and row["model"] == "model-a"
        assert alice_rows[cut]["samples"][-1]["finish_reason"] == "length"
        assert alice_rows[later]["samples"][0]["finish_reason"] == "length"
        assert alice_rows[later]["previous_response_id"] == cut
        bob_rows = await exported_jsonl(url, BOB, tmp_path / "bob.jsonl")
        assert set(bob_rows) == {bobs}
        everyone = await exported_jsonl(url, OPERATOR, tmp_path / "all.jsonl")
        assert everyone == {**alice_rows, **bob_rows}

        parquet = tmp_path / "alice.parquet"
        assert await export(url, ALICE, ParquetWriter(parquet)) == 3
        table = pq.read_table(parquet)
        columns = {
            rid: {k: v for k, v in row.items() if k != "object"} for rid, row in alice_rows.items()
        }
        assert {row["id"]: row for row in table.to_pylist()} == columns  # every field but
        # ``object`` (the same for every row), with nulls where JSON has them
    finally:
        await server.runner.cleanup()


async def test_pages_are_bounded_and_a_bad_page_request_is_an_error(
    token_peer: TokenPeer, tokenizer_dir: Path, tmp_path: Path
) -> None:
    server = await start(token_peer, tokenizer_dir, "memory://")
    url = f"{server.base_url}/responses/tokens/export"
    try:
        async with aiohttp.ClientSession(headers=auth(ALICE)) as http:
            ids = [await create(http, server.base_url, ALICE, input=f"q{n}") for n in range(3)]
            seen: list[str] = []
            after: str | None = ""
            while after is not None:
                query = {"limit": "1", **({"after": after} if after else {})}
                async with http.get(url, params=query) as resp:
                    page = await resp.json()
                assert len(page["data"]) <= 1
                seen += [row["id"] for row in page["data"]]
                after = page["next"]
            assert sorted(seen) == sorted(ids)
            for bad in ("0", "101", "x"):
                async with http.get(url, params={"limit": bad}) as resp:
                    body = await resp.json()
                assert resp.status == 400
                assert body["error"]["code"] == "invalid_value"
                assert body["error"]["param"] == "limit"
        out = tmp_path / "cli.jsonl"
        argv = ["export", "--url", server.base_url, "--key", ALICE, "--out", str(out)]
        assert await asyncio.to_thread(main, argv) == 0  # the command itself, as a user runs it
        with open(out, "rb") as file:  # noqa: ASYNC230
            assert sorted(msgspec.json.decode(line)["id"] for line in file) == sorted(ids)
        assert await asyncio.to_thread(main, [*argv[:-2], "--key", "sk-nobody"]) == 1
        with pytest.raises(ApiError) as failed:  # a key the server does not know
            await export(server.base_url, "sk-nobody", JsonlWriter(open(tmp_path / "x", "wb")))  # noqa: ASYNC230, SIM115 - the writer closes it
        assert failed.value.status == 401
    finally:
        await server.runner.cleanup()
