"""STORE-12, STORE-15: ``rollout serve --store postgresql://…`` in two processes on one database,
driven by the official openai SDK: a ``previous_response_id`` chain alternates between them over
HTTP and WebSocket, each reads what the other stored, a delete through one is not found on
the other, and another API key's records are not found on either (OWN-2). Then the Postgres
specifics: a versioned schema created once however many servers
start, and a database from a newer server refused at start."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import openai
import psycopg
import pytest
from openai import AsyncOpenAI

from cli.main import main
from engine.store.postgres import SCHEMA_VERSION, VERSION_TABLE
from tests.store._procs import ServeProcess

Serve = Callable[..., Awaitable[ServeProcess]]


def _sdk(server: ServeProcess) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{server.base}/v1", api_key="unused", max_retries=0)


async def _over_ws(server: ServeProcess, previous: str, text: str) -> Any:
    client = _sdk(server)
    try:
        async with client.responses.connect() as conn:
            await conn.response.create(model="sim", input=text, previous_response_id=previous)
            async for event in conn:
                assert event.type not in ("error", "response.failed"), event
                if event.type == "response.completed":
                    return event.response
    finally:
        await client.close()
    raise AssertionError("the socket ended before response.completed")


async def test_sdk_chain_across_two_servers_on_one_database(
    postgres_url: str, serve: Serve
) -> None:
    a, b = await serve(postgres_url), await serve(postgres_url)
    on_a, on_b = _sdk(a), _sdk(b)
    try:
        first = await on_a.responses.create(model="sim", input="remember: blue")
        second = await on_b.responses.create(
            model="sim", input="and green", previous_response_id=first.id
        )
        third = await _over_ws(a, second.id, "and red")  # a new socket on the other process
        fourth = await on_b.responses.create(
            model="sim", input="what did I say?", previous_response_id=third.id
        )
        chain = [first, second, third, fourth]
        assert [r.previous_response_id for r in chain[1:]] == [r.id for r in chain[:-1]]
        tokens = [r.usage.input_tokens for r in chain if r.usage is not None]
        assert len(tokens) == 4 and tokens == sorted(set(tokens)), "each turn saw the history"
        for client in (on_a, on_b):  # each process reads what either stored
            for response in chain:
                got = await client.responses.retrieve(response.id)
                assert got.output_text == response.output_text
        items = await on_a.responses.input_items.list(second.id)
        assert [i.type for i in items.data] == ["message"]
        await on_b.responses.delete(second.id)
        with pytest.raises(openai.NotFoundError):
            await on_a.responses.retrieve(second.id)
        after = await on_a.responses.create(  # what continued from it is unaffected (STORE-11)
            model="sim", input="still here?", previous_response_id=fourth.id
        )
        assert after.usage is not None and after.usage.input_tokens > tokens[-1]
    finally:
        await on_a.close()
        await on_b.close()


async def test_schema_is_versioned_and_created_once(postgres_url: str, serve: Serve) -> None:
    await serve(postgres_url)
    await serve(postgres_url)  # a second server on the same database migrates nothing
    with psycopg.connect(postgres_url) as conn:
        rows = conn.execute(f"SELECT version FROM {VERSION_TABLE}").fetchall()
        assert rows == [(v,) for v in range(1, SCHEMA_VERSION + 1)]  # each applied once
        conn.execute(f"INSERT INTO {VERSION_TABLE} VALUES (%s)", (SCHEMA_VERSION + 1,))


def test_newer_schema_is_refused_at_start(
    postgres_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with psycopg.connect(postgres_url) as conn:
        conn.execute(f"CREATE TABLE {VERSION_TABLE} (version integer NOT NULL)")
        conn.execute(f"INSERT INTO {VERSION_TABLE} VALUES (%s)", (SCHEMA_VERSION + 1,))
    assert main(["serve", "--port", "0", "--store", postgres_url]) == 2
    assert "newer than this server's" in capsys.readouterr().err


async def test_another_keys_response_is_not_found_on_any_server(
    postgres_url: str, serve: Serve, tmp_path: Path
) -> None:
    """OWN-1, OWN-2 on a shared Postgres: a record carries its key's digest, and another key
    gets exactly the unknown-id answers on every server; the owner still continues it."""
    keys = tmp_path / "keys"
    keys.write_text("key-alice\nkey-bob\n")
    a = await serve(postgres_url, "--api-keys-file", str(keys))
    b = await serve(postgres_url, "--api-keys-file", str(keys))
    alice_a = AsyncOpenAI(base_url=f"{a.base}/v1", api_key="key-alice", max_retries=0)
    alice_b = AsyncOpenAI(base_url=f"{b.base}/v1", api_key="key-alice", max_retries=0)
    bob_b = AsyncOpenAI(base_url=f"{b.base}/v1", api_key="key-bob", max_retries=0)
    try:
        first = await alice_a.responses.create(model="sim", input="mine")
        with pytest.raises(openai.NotFoundError):
            await bob_b.responses.retrieve(first.id)
        with pytest.raises(openai.BadRequestError) as refused:
            await bob_b.responses.create(model="sim", input="x", previous_response_id=first.id)
        assert refused.value.code == "previous_response_not_found"
        with pytest.raises(openai.NotFoundError):
            await bob_b.responses.delete(first.id)
        second = await alice_b.responses.create(
            model="sim", input="still mine", previous_response_id=first.id
        )
        assert second.previous_response_id == first.id
    finally:
        for client in (alice_a, alice_b, bob_b):
            await client.close()


async def test_another_keys_response_is_not_compacted_or_counted(
    postgres_url: str, serve: Serve, tmp_path: Path
) -> None:
    """OWN-2 for the requests that read a stored conversation without running a rollout
    (COMPACT-1, TOKENS-1): another key gets ``previous_response_not_found``, the owner the
    answer."""
    keys = tmp_path / "keys"
    keys.write_text("key-alice\nkey-bob\n")
    server = await serve(postgres_url, "--api-keys-file", str(keys))
    alice = AsyncOpenAI(base_url=f"{server.base}/v1", api_key="key-alice", max_retries=0)
    try:
        first = await alice.responses.create(model="sim", input="my secret plans")
    finally:
        await alice.close()
    body = {"model": "sim", "previous_response_id": first.id}
    async with aiohttp.ClientSession() as http:
        for path in ("compact", "input_tokens"):
            url = f"{server.base}/v1/responses/{path}"
            for key, status in (("key-bob", 400), ("key-alice", 200)):
                headers = {"Authorization": f"Bearer {key}"}
                async with http.post(url, json=body, headers=headers) as resp:
                    data = await resp.json()
                    assert resp.status == status, (path, key, data)
                    if status == 400:
                        assert data["error"]["code"] == "previous_response_not_found"
                        assert "secret" not in json.dumps(data)
