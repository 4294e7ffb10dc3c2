"""``Idempotency-Key`` on ``POST /v1/responses`` (IDEM-1..IDEM-6, RETRY-1, RETRY-2), through the
openai SDK against a real server on a real SQLite store with a JSONL ledger.

The model is a ``ScriptedModel`` with as many turns as the test expects runs: a second run
raises, so a request run twice cannot pass. Billing is counted in the ledger file after the
server stopped (its post-inference worker drained), not in the in-memory window.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from engine.core import EngineConfig
from engine.models.base import TextDelta
from engine.models.router import Router
from engine.models.sim.scripted import ScriptedModel
from engine.store.embedded.sqlite import SqliteStore
from tests.support.server import LiveServer, start_server
from tests.support.wait import wait_for

KEY = {"Idempotency-Key": "order-7f3a"}


@dataclass
class Node:
    live: LiveServer
    model: ScriptedModel
    gate: asyncio.Event
    ledger: Path
    db: Path
    stopped: bool = False

    async def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            await self.live.runner.cleanup()

    async def ledger_records(self) -> list[dict[str, Any]]:
        await self.stop()  # the worker drains the queue into the ledger first
        if not self.ledger.exists():
            return []
        return [json.loads(line) for line in self.ledger.read_text().splitlines()]


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    gate = asyncio.Event()
    gate.set()  # open unless a test holds it
    model = ScriptedModel([[TextDelta("Hello"), gate, TextDelta(" world")]])
    ledger, db = tmp_path / "ledger.jsonl", tmp_path / "idem.db"
    live = await start_server(
        EngineConfig(tokens_per_second=0, ledger_path=ledger),
        Router(routes={}, default=model),
        store=SqliteStore(db, deadline_s=0.5),
    )
    running = Node(live, model, gate, ledger, db)
    try:
        yield running
    finally:
        await running.stop()


def _sdk(node: Node, retries: int = 2) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=node.live.base_url, api_key="x", max_retries=retries)


async def test_a_repeat_gets_the_first_answer_and_bills_nothing(node: Node) -> None:
    """IDEM-2, IDEM-4: the same id and output again; the model ran once, one ledger record."""
    sdk = _sdk(node)
    try:
        first = await sdk.responses.create(model="m", input="hi", extra_headers=KEY)
        again = await sdk.responses.with_raw_response.create(
            model="m", input="hi", extra_headers=KEY
        )
    finally:
        await sdk.close()
    assert again.headers.get("idempotent-replayed") == "true"
    second = again.parse()
    assert (
        (second.id, second.output_text)
        == (first.id, first.output_text)
        == (
            first.id,
            "Hello world",
        )
    )
    assert len(node.model.requests) == 1
    records = await node.ledger_records()
    assert [r["response_ids"] for r in records] == [[first.id]]


async def test_an_sse_repeat_replays_the_stream(node: Node) -> None:
    """IDEM-4: the repeat of a streamed create is the same stream, event for event."""
    sdk = _sdk(node)
    try:
        runs = []
        for _ in range(2):
            stream = await sdk.responses.create(
                model="m", input="hi", stream=True, extra_headers=KEY
            )
            runs.append([event.model_dump() async for event in stream])
    finally:
        await sdk.close()
    assert runs[0] == runs[1]
    assert runs[0][-1]["type"] == "response.completed"
    assert len(node.model.requests) == 1
    assert len(await node.ledger_records()) == 1


async def test_a_repeat_while_the_first_runs_joins_it(node: Node) -> None:
    """IDEM-4: a repeat on the node still running the first waits for its answer."""
    node.gate.clear()
    sdk = _sdk(node)
    try:
        first = asyncio.create_task(sdk.responses.create(model="m", input="hi", extra_headers=KEY))
        await wait_for(lambda: len(node.model.requests) == 1, "the first run to start")
        second = asyncio.create_task(sdk.responses.create(model="m", input="hi", extra_headers=KEY))
        node.gate.set()
        a, b = await asyncio.gather(first, second)
    finally:
        await sdk.close()
    assert a.id == b.id and b.output_text == "Hello world"
    assert len(node.model.requests) == 1
    assert len(await node.ledger_records()) == 1


async def test_a_streamed_repeat_follows_the_running_first_live(node: Node) -> None:
    """LIVE-8: the repeat of a streamed create that is still running follows its stream live:
    it gets the events sent so far while the model is held mid-answer (the first's delta
    ``Hello`` before the gate opens), then the rest; one run, one bill."""
    node.gate.clear()
    sdk = _sdk(node)
    try:
        first = await sdk.responses.create(model="m", input="hi", stream=True, extra_headers=KEY)
        seen = []
        async for event in first:
            seen.append(event.model_dump())
            if event.type == "response.output_text.delta":
                break  # held at the gate: the first is still running
        repeat = await sdk.responses.create(model="m", input="hi", stream=True, extra_headers=KEY)
        followed = []
        async for event in repeat:
            followed.append(event.model_dump())
            if event.type == "response.output_text.delta":
                break  # live: the held run's delta reached the repeat before it ended
        node.gate.set()
        followed += [event.model_dump() async for event in repeat]
        seen += [event.model_dump() async for event in first]
    finally:
        await sdk.close()
    assert followed == seen
    assert seen[-1]["type"] == "response.completed"
    assert len(node.model.requests) == 1
    assert len(await node.ledger_records()) == 1


async def test_a_different_body_with_the_key_is_refused(node: Node) -> None:
    """IDEM-5: 422 ``idempotency_key_reused``; nothing runs for it."""
    sdk = _sdk(node, retries=0)
    try:
        await sdk.responses.create(model="m", input="hi", extra_headers=KEY)
        with pytest.raises(openai.UnprocessableEntityError) as info:
            await sdk.responses.create(model="m", input="other", extra_headers=KEY)
    finally:
        await sdk.close()
    assert info.value.code == "idempotency_key_reused"
    assert len(node.model.requests) == 1


async def test_a_refused_request_releases_its_key(node: Node) -> None:
    """IDEM-3: a request refused before any work (400) keeps nothing; its fixed retry runs."""
    url = f"{node.live.base_url}/responses"
    async with aiohttp.ClientSession() as http:
        bad = {"model": "m", "input": "hi", "temperature": "hot"}
        async with http.post(url, json=bad, headers=KEY) as resp:
            assert resp.status == 400
        good = {"model": "m", "input": "hi"}
        async with http.post(url, json=good, headers=KEY) as resp:
            assert resp.status == 200, await resp.text()
            assert "idempotent-replayed" not in resp.headers
        async with http.post(url, json=good, headers={**KEY, "Idempotency-Key": ""}) as resp:
            assert resp.status == 400
            assert (await resp.json())["error"]["code"] == "invalid_idempotency_key"
    assert len(node.model.requests) == 1


async def test_a_failed_terminal_write_is_never_run_again(node: Node) -> None:
    """RETRY-2, IDEM-4: the model ran, then the store did not take the terminal write (SQLite's
    write lock held by another connection past the store's deadline). The answer is a 500
    ``store_unavailable`` with ``x-should-retry: false``: the SDK (2 retries allowed) does not
    send it again. The key's outcome could not be stored either, so a later repeat is refused
    409, never run. One model run, one ledger record."""
    node.gate.clear()
    sdk, once = _sdk(node), _sdk(node, retries=0)
    holder: sqlite3.Connection | None = None
    try:
        first = asyncio.create_task(sdk.responses.create(model="m", input="hi", extra_headers=KEY))
        await wait_for(lambda: len(node.model.requests) == 1, "the run to start")
        holder = sqlite3.connect(node.db, isolation_level=None, timeout=0)
        holder.execute("BEGIN IMMEDIATE")
        node.gate.set()
        with pytest.raises(openai.InternalServerError) as info:
            await first
        assert info.value.status_code == 500
        assert info.value.code == "store_unavailable"
        assert info.value.response.headers.get("x-should-retry") == "false"
        holder.execute("ROLLBACK")
        holder.close()
        holder = None
        with pytest.raises(openai.ConflictError) as conflict:
            await once.responses.create(model="m", input="hi", extra_headers=KEY)
        assert conflict.value.code == "idempotency_key_in_use"
    finally:
        if holder is not None:
            holder.close()
        await sdk.close()
        await once.close()
    assert len(node.model.requests) == 1
    assert len(await node.ledger_records()) == 1
