"""Conversations on every store backend (SPEC §19): the records (CONV-8: a segment per append,
merged past ``MAX_SEGMENTS``; owner head lines, invisible to the response routes), a restart
that continues a conversation from the store, and two ``rollout serve`` nodes sharing one store
racing on one conversation (CONV-7: the second is refused with 409 ``conversation_locked``
while the first runs, then continues after it)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from engine.store import MemoryStore, ResponseStore, open_store
from engine.store.conversations import MAX_SEGMENTS, ConversationLocked, Conversations, Opened
from engine.store.framing import peek
from protocol.items import Message
from tests.store._procs import RedisServer, ServeProcess
from tests.support.fixtures import sdk_client
from tests.support.server import start_server
from tests.support.wait import wait_for

Serve = Callable[..., Awaitable[ServeProcess]]


@pytest.fixture(params=["memory", "sqlite", "redis", "postgres"])
def backend_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "memory":
        return "memory://"
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'c.db'}"
    if request.param == "postgres":
        url: str = request.getfixturevalue("postgres_url")
        return url
    redis: RedisServer = request.getfixturevalue("redis_server")
    return redis.url


async def _opened(url: str) -> ResponseStore:
    store = open_store(url)
    await store.open()
    return store


async def test_segments_merge_and_owner_heads(backend_url: str) -> None:
    """CONV-8: each append is one segment; past ``MAX_SEGMENTS`` an append merges them, order
    kept. Every blob carries the owner's head line with the tombstone flag (STORE-20), so the
    response routes find nothing under a conversation's keys. A lock is held across stores
    sharing the backend, and a delete removes every key (CONV-4, CONV-7)."""
    store = await _opened(backend_url)
    try:
        conversations = Conversations(store)
        head = await conversations.create(
            "owner-a", {"k": "v"}, [Message(role="user", content="0")]
        )
        for n in range(1, MAX_SEGMENTS + 8):
            opened = await conversations.open(head.id, "owner-a")
            assert opened is not None
            await conversations.append(opened, [Message(role="user", content=str(n))])
            await opened.lock.release()
        head_now = await conversations.head(head.id, "owner-a")
        assert head_now is not None and len(head_now.segments) <= MAX_SEGMENTS
        items = await conversations.items(head_now)
        assert [item.content[0].text for item in items] == [str(n) for n in range(MAX_SEGMENTS + 8)]
        assert [i.content[0].text for i in await conversations.items(head_now, after=5)] == [
            str(n) for n in range(5, MAX_SEGMENTS + 8)
        ]
        for key in [head.id, *head_now.segments]:
            blob = await store._read_one(key)
            found = peek(blob) if blob is not None else None
            assert found is not None and found.owner == "owner-a" and found.deleted, key
            assert await store.get(key, "owner-a") is None  # no response route sees it
        assert await conversations.head(head.id, "owner-b") is None  # another owner's
        if not isinstance(store, MemoryStore):  # a second process on the same backend
            other = await _opened(backend_url)
            try:
                held = await conversations.open(head.id, "owner-a")
                assert held is not None
                with pytest.raises(ConversationLocked):
                    await Conversations(other).open(head.id, "owner-a")
                await held.lock.release()
                again = await Conversations(other).open(head.id, "owner-a")
                assert again is not None
                await Conversations(other).delete(again)
                await again.lock.release()
            finally:
                await other.close()
        else:
            opened = await conversations.open(head.id, "owner-a")
            assert opened is not None
            await conversations.delete(opened)
            await opened.lock.release()
        for key in [head.id, *head_now.segments]:
            assert await store._read_one(key) is None, key
    finally:
        await store.close()


async def test_a_lapsed_lock_released_late_frees_no_other_writers(backend_url: str) -> None:
    """CONV-7 on every store: a lock is released only by its holder (compare-and-delete on its
    token). Writer A's lock lapses (a 0.2 s lock), B claims the conversation, A's late release
    must leave B's lock in place: C is refused while B holds it, and gets in once B released."""
    store = await _opened(backend_url)
    try:
        head = await Conversations(store).create("owner-a", {}, [])
        a = await Conversations(store, lock_s=0.2).open(head.id, "owner-a")
        assert a is not None

        async def claim_b() -> Opened | None:
            with contextlib.suppress(ConversationLocked):
                return await Conversations(store).open(head.id, "owner-a")
            return None

        b = await wait_for(claim_b, "A's 0.2 s lock to lapse and B to claim it")
        assert isinstance(b, Opened)
        await a.lock.release()  # late: the lock is B's now
        with pytest.raises(ConversationLocked):
            await Conversations(store).open(head.id, "owner-a")  # C, while B holds it
        await b.lock.release()
        c = await Conversations(store).open(head.id, "owner-a")
        assert c is not None
        await c.lock.release()
    finally:
        await store.close()


async def test_a_conversation_outlives_a_restart(store_url: str) -> None:
    """CONV-6 after a restart (SQLite, Redis, Postgres): the new process continues the
    conversation from its stored response (the store path, with its whole context: the tool
    call it answers is there)."""
    first = await start_server(store=await _opened(store_url))
    try:
        async with sdk_client(first) as client:
            conv = await client.conversations.create(metadata={"run": "1"})
            call = (
                await client.responses.create(
                    model="sim", input="lookup q", tools=[_TOOL], conversation=conv.id
                )
            ).output[0]
            assert call.type == "function_call"
    finally:
        await first.runner.cleanup()
    second = await start_server(store=await _opened(store_url))
    try:
        async with sdk_client(second) as client:
            assert (await client.conversations.retrieve(conv.id)).metadata == {"run": "1"}
            output = {"type": "function_call_output", "call_id": call.call_id, "output": "ok"}
            answer = await client.responses.create(
                model="sim", input=[output], tools=[_TOOL], conversation=conv.id
            )
            assert answer.output_text.startswith("Based on the tool results")
            assert second.engine.counters["create.store_hydrate"] == 1
            listed = await client.conversations.items.list(conv.id, order="asc")
            assert [item.type for item in listed.data] == [
                "message",
                "function_call",
                "function_call_output",
                "message",
            ]
    finally:
        await second.runner.cleanup()


_TOOL = {
    "type": "function",
    "name": "lookup",
    "description": "Look something up.",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
}


@pytest.fixture(params=["redis", "postgres"])
def shared_url(request: pytest.FixtureRequest) -> str:
    if request.param == "postgres":
        url: str = request.getfixturevalue("postgres_url")
        return url
    redis: RedisServer = request.getfixturevalue("redis_server")
    return redis.url


async def _sse_until_delta(resp: aiohttp.ClientResponse) -> None:
    async for line in resp.content:
        if line.startswith(b"data: ") and b"output_text.delta" in line:
            return
    raise AssertionError("the stream ended before any text")


async def _sse_final(resp: aiohttp.ClientResponse) -> dict[str, Any]:
    async for line in resp.content:
        if line.startswith(b"data: ") and b'"response.completed"' in line:
            final: dict[str, Any] = json.loads(line[6:])["response"]
            return final
    raise AssertionError("no response.completed")


async def test_two_nodes_race_on_one_conversation(shared_url: str, serve: Serve) -> None:
    """CONV-7 across two nodes sharing the store: while node A's response on a conversation is
    streaming, node B's create on it (HTTP, and WebSocket) is refused with 409
    ``conversation_locked`` and nothing is appended for it; once A's has ended, B's runs with A's
    items as its context, and the conversation lists A's turn, then B's."""
    a, b = await serve(shared_url, "--tps", "5"), await serve(shared_url)
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{a.base}/v1/conversations", json={}) as resp:
            conv = (await resp.json())["id"]
        slow = {"model": "sim", "input": "tell me a story", "conversation": conv, "stream": True}
        async with http.post(f"{a.base}/v1/responses", json=slow) as streaming:
            await _sse_until_delta(streaming)  # A holds the conversation now
            racing = {"model": "sim", "input": "me too", "conversation": conv}
            async with http.post(f"{b.base}/v1/responses", json=racing) as refused:
                assert refused.status == 409, await refused.text()
                error = (await refused.json())["error"]
                assert error["code"] == "conversation_locked" and error["param"] == "conversation"
            async with http.ws_connect(b.ws_url) as ws:
                await ws.send_str(json.dumps({"type": "response.create", **racing}))
                frame = json.loads((await ws.receive(timeout=30)).data)
                assert frame["type"] == "error" and frame["status"] == 409
                assert frame["error"]["code"] == "conversation_locked"
            first = await _sse_final(streaming)
        async with http.post(f"{b.base}/v1/responses", json=racing) as resp:
            assert resp.status == 200, await resp.text()
            second = await resp.json()
        assert second["usage"]["input_tokens"] > first["usage"]["input_tokens"]
        async with http.get(f"{b.base}/v1/conversations/{conv}/items?order=asc") as resp:
            items = (await resp.json())["data"]
        texts = [item["content"][0]["text"] for item in items]
        assert texts[0] == "tell me a story" and texts[2] == "me too" and len(texts) == 4


async def test_bounds_in_bytes_and_items() -> None:
    """CONV-9: a conversation whose items reach the record bound refuses more (400
    ``conversation_too_large``, items route and create); one append over the bound is
    ``store_record_too_large`` as a response's record is (STORE-9), and the conversation is
    let go."""
    live = await start_server(store=MemoryStore(max_record_bytes=2048))
    try:
        async with sdk_client(live) as client:
            conv = await client.conversations.create()
            with pytest.raises(openai.BadRequestError) as huge:
                await client.conversations.items.create(
                    conv.id, items=[{"role": "user", "content": "x" * 4096}]
                )
            assert huge.value.code == "store_record_too_large"
            with pytest.raises(openai.BadRequestError) as full:
                for _ in range(5):  # ~700 encoded bytes each: full after the third
                    await client.conversations.items.create(
                        conv.id, items=[{"role": "user", "content": "y" * 600}]
                    )
            assert full.value.code == "conversation_too_large" and full.value.param == "items"
            listed = await client.conversations.items.list(conv.id)
            assert len(listed.data) == 3
            with pytest.raises(openai.BadRequestError) as create:
                await client.responses.create(model="sim", input="hi", conversation=conv.id)
            assert create.value.code == "conversation_too_large"
            assert create.value.param == "conversation"
            other = await client.conversations.create()
            with pytest.raises(openai.APIStatusError) as over:
                await client.responses.create(model="sim", input="w" * 4096, conversation=other.id)
            assert over.value.code == "store_record_too_large"
            await client.conversations.update(other.id, metadata={"still": "usable"})
    finally:
        await live.runner.cleanup()
