"""A resend that carries nothing continues too (COMPAT-7..COMPAT-9), end to end against the
token peer (TOK-42), which samples ids a re-render would never produce: every prompt it sees
after a conversation's first is checked to be the previous prompt, its answer and the new
items' ids, exactly, as with ``previous_response_id``.

Plain JSON over HTTP (``store: false`` and ``store: true``), the openai SDK (its ``model_dump``
shapes, with and without ``None`` fields, ids and status dropped, an answer sent back as a
string), its WebSocket with ``store: false``; think, plain and harmony routes. A changed
earlier item starts afresh (the peer sees a re-render, never a wrong prefix), another key's
identical history is not matched, and a rejected resend names the request's own items."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI

from engine.core import EngineConfig
from engine.server.transport.server_config import ServerConfig
from tests.support.server import LiveServer, start_server
from tests.support.tools import WEATHER
from tests.upstream.conftest import StartEngine
from tests.upstream.reasoning_peer import HARMONY_CHAIN as HARMONY
from tests.upstream.reasoning_peer import PLAIN_CHAIN as PLAIN
from tests.upstream.reasoning_peer import THINK_CHAIN as THINK
from tests.upstream.reasoning_peer import HarmonyPeer, harmony_router
from tests.upstream.token_peer import TokenPeer, assert_exact, tokens_router

Shape = Callable[[dict[str, Any]], dict[str, Any]]


def follow_up(history: list[dict[str, Any]], output: list[dict[str, Any]]) -> None:
    """The output as the client got it, then the tool's answer or a thanks."""
    history += output
    last = output[-1]
    if last.get("type") == "function_call":
        history.append(
            {"type": "function_call_output", "call_id": last["call_id"], "output": "sunny"}
        )
    else:
        history.append({"role": "user", "content": "Thanks"})


async def post(
    server: LiveServer, body: dict[str, Any], key: str = "x", status: int = 200
) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {key}"}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{server.base_url}/responses", json=body, headers=headers) as resp,
    ):
        answer: dict[str, Any] = await resp.json()
        assert resp.status == status, answer
    return answer


async def http_chain(
    server: LiveServer, turns: int, *, store: bool = False, key: str = "x"
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``turns`` stateless creates, the whole history each time as received (no training
    fields: nothing is carried): the answers and the history after them."""
    history: list[dict[str, Any]] = [{"role": "user", "content": "Weather?"}]
    answers: list[dict[str, Any]] = []
    for _ in range(turns):
        body = {"model": "model-a", "input": history, "tools": [WEATHER], "store": store}
        answer = await post(server, body, key)
        answers.append(answer)
        follow_up(history, answer["output"])
    return answers, history


def counters(server: LiveServer) -> dict[str, int]:
    return dict(server.engine.counters)


@pytest.mark.parametrize(("parser", "script"), [("think", THINK), (None, PLAIN)])
async def test_a_resend_continues_exactly_over_http(
    engine_for: StartEngine,
    think_peer: TokenPeer,
    qwen3_dir: Path,
    parser: str | None,
    script: list[str],
) -> None:
    """COMPAT-7: three stateless ``store: false`` turns carrying no ids: every prompt after the
    first is the previous prompt, its answer and the new items' ids (the peer checks), the
    history was rendered once, and each later turn continued the context it repeats."""
    extra = {"reasoning_parser": parser} if parser else {}
    server = await engine_for(tokens_router(think_peer, qwen3_dir, "vllm", **extra))
    think_peer.script.extend(script)
    await http_chain(server, 3)
    assert_exact(think_peer)
    assert counters(server)["create.resent"] == 2
    assert counters(server)["create.stateless"] == 3
    assert server.engine.router.backend_of("model-a").stats["render.full"] == 1


async def test_harmony_resend_continues_exactly(
    engine_for: StartEngine, harmony_peer: HarmonyPeer
) -> None:
    """COMPAT-7 on harmony's encoding and channels."""
    server = await engine_for(harmony_router(harmony_peer))
    harmony_peer.script.extend(HARMONY)
    await http_chain(server, 3)
    assert_exact(harmony_peer)
    assert counters(server)["create.resent"] == 2


async def test_websocket_store_false_resend_is_exact(
    engine_for: StartEngine, think_peer: TokenPeer, qwen3_dir: Path
) -> None:
    """COMPAT-7 over the SDK's WebSocket with ``store: false``, the whole input each time (no
    ``previous_response_id``), the items as the SDK's ``model_dump(exclude_none=True)``."""
    server = await engine_for(
        tokens_router(think_peer, qwen3_dir, "vllm", reasoning_parser="think")
    )
    think_peer.script.extend(THINK)
    history: list[dict[str, Any]] = [{"role": "user", "content": "Weather?"}]
    client = AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    async with client, client.responses.connect() as conn:
        for _ in range(3):
            await conn.response.create(model="model-a", input=history, tools=[WEATHER], store=False)
            done: list[dict[str, Any]] = []
            async for event in conn:
                assert event.type not in ("error", "response.failed"), event
                if event.type == "response.output_item.done":
                    done.append(event.item.model_dump(exclude_none=True))
                if event.type == "response.completed":
                    break
            follow_up(history, done)
    assert_exact(think_peer)
    assert counters(server)["create.resent"] == 2


def _dump_all(item: dict[str, Any]) -> dict[str, Any]:
    return item  # model_dump(): the None fields sent as null


def _no_ids(item: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in item.items() if k not in ("id", "status") and v is not None}


def _as_string(item: dict[str, Any]) -> dict[str, Any]:
    """An answer sent back chat-style: ``{"role": "assistant", "content": "<text>"}``."""
    if item.get("type") == "message":
        return {"role": "assistant", "content": item["content"][0]["text"]}
    return _no_ids(item)


@pytest.mark.parametrize("shape", [_dump_all, _no_ids, _as_string], ids=lambda s: s.__name__)
async def test_the_sdks_shapes_match(
    engine_for: StartEngine, think_peer: TokenPeer, qwen3_dir: Path, shape: Shape
) -> None:
    """COMPAT-8: the SDK's parsed output sent back with ``model_dump()`` (``None`` fields as
    null), without ids and status, or an answer as a plain string: each still continues."""
    server = await engine_for(tokens_router(think_peer, qwen3_dir, "vllm"))
    think_peer.script.extend(PLAIN)
    history: list[Any] = [{"role": "user", "content": "Weather?"}]
    async with AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0) as client:
        for _ in range(3):
            answer = await client.responses.create(
                model="model-a", input=history, tools=[WEATHER], store=False
            )
            follow_up(history, [shape(item.model_dump()) for item in answer.output])
    assert_exact(think_peer)
    assert counters(server)["create.resent"] == 2


@pytest.mark.parametrize("changed", ["message", "arguments"])
async def test_a_changed_earlier_item_renders_afresh(
    engine_for: StartEngine, think_peer: TokenPeer, qwen3_dir: Path, changed: str
) -> None:
    """COMPAT-8: the first turn's history with its question or the call's arguments edited
    matches nothing: the peer gets a whole new rendering that reads the edit (never the old
    prefix), and nothing is counted as resent."""
    server = await engine_for(tokens_router(think_peer, qwen3_dir, "vllm"))
    think_peer.script.extend(PLAIN[:2])
    _, history = await http_chain(server, 1)
    if changed == "message":
        history[0] = {"role": "user", "content": "Weather in Rome?"}
        edit = "Weather in Rome?"
    else:
        history[1] = {**history[1], "arguments": '{"city": "Rome"}'}
        edit = '"Rome"'
    await post(server, {"model": "model-a", "input": history, "tools": [WEATHER], "store": False})
    assert think_peer.extends(1) is None
    assert edit in think_peer.text(think_peer.turns[1].prompt)
    assert counters(server).get("create.resent", 0) == 0


async def test_another_keys_identical_history_does_not_match(
    think_peer: TokenPeer, qwen3_dir: Path
) -> None:
    """COMPAT-9 (OWN-2): Bob resends Alice's exact history: his prompt is rendered afresh
    (Alice's context is never his); Alice's own resend continues hers exactly."""
    config = EngineConfig(tokens_per_second=0, default_model="model-a")
    server = await start_server(
        config,
        tokens_router(think_peer, qwen3_dir, "vllm"),
        server=ServerConfig(api_keys=frozenset({"ka", "kb"})),
    )
    try:
        think_peer.script.extend(PLAIN[:1] + PLAIN[1:2] * 2)
        _, history = await http_chain(server, 1, key="ka")
        body = {"model": "model-a", "input": history, "tools": [WEATHER], "store": False}
        await post(server, body, "kb")
        assert think_peer.extends(1) is None
        assert counters(server).get("create.resent", 0) == 0
        await post(server, body, "ka")
        assert think_peer.extends(2) == 0
        assert counters(server)["create.resent"] == 1
    finally:
        await server.runner.cleanup()


async def test_a_stored_resend_is_stored(
    engine_for: StartEngine, think_peer: TokenPeer, qwen3_dir: Path
) -> None:
    """COMPAT-7 with ``store: true``: exact, each resent response names no parent and lists
    the whole request as its input; with the responses it repeated deleted (tombstones,
    STORE-11), its token trajectory (TOK-8) is still the peer's last prompt and answer."""
    server = await engine_for(tokens_router(think_peer, qwen3_dir, "vllm"))
    think_peer.script.extend(PLAIN)
    answers, _ = await http_chain(server, 3, store=True)
    assert_exact(think_peer)
    assert counters(server)["create.resent"] == 2
    last = answers[-1]
    assert last["previous_response_id"] is None
    async with AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0) as client:
        for answer in answers[:-1]:
            await client.responses.delete(answer["id"])
        listed = await client.responses.input_items.list(last["id"], order="asc")
        assert len(listed.data) == 5  # question, call, output, answer, thanks
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{server.base_url}/responses/{last['id']}/tokens") as resp,
    ):
        tokens = await resp.json()
        assert resp.status == 200, tokens
    turn = think_peer.turns[-1]
    assert tokens["token_ids"] == turn.prompt + turn.answer


async def test_a_rejected_resend_names_the_requests_own_items(
    engine_for: StartEngine, think_peer: TokenPeer, qwen3_dir: Path
) -> None:
    """COMPAT-8: a resend whose new item is at fault is refused as on the stateless path: the
    error's ``param`` indexes the request's own ``input``, not the items after the match."""
    server = await engine_for(tokens_router(think_peer, qwen3_dir, "vllm"))
    think_peer.script.extend(PLAIN[:1])
    _, history = await http_chain(server, 1)
    history[2] = {**history[2], "call_id": "call_unknown"}
    body = {"model": "model-a", "input": history, "tools": [WEATHER], "store": False}
    error = (await post(server, body, status=400))["error"]
    assert error["param"].startswith("input[2]"), error
    assert len(think_peer.turns) == 1


async def test_a_store_false_id_still_continues_nothing_over_http(
    engine_for: StartEngine, think_peer: TokenPeer, qwen3_dir: Path
) -> None:
    """COMPAT-9 (CACHE-2): the cache now holds ``store: false`` contexts for resends, but
    their ids are still not found over HTTP."""
    server = await engine_for(tokens_router(think_peer, qwen3_dir, "vllm"))
    think_peer.script.extend(PLAIN[:1])
    answers, _ = await http_chain(server, 1)
    body = {
        "model": "model-a",
        "input": [{"type": "function_call_output", "call_id": "x", "output": "sunny"}],
        "previous_response_id": answers[0]["id"],
        "store": False,
    }
    error = (await post(server, body, status=400))["error"]
    assert error["code"] == "previous_response_not_found"


async def test_a_resends_held_items_are_not_decoded_again(
    engine_for: StartEngine, think_peer: TokenPeer, qwen3_dir: Path
) -> None:
    """COMPAT-7: the items a resend sends again byte for byte (the input of the create before
    it, as a client re-serializes its history) are taken as that create decoded them: only
    the items past them are decoded (``resend.raw_held`` counts the others: 1 item on the
    second turn, 3 on the third), and the continuation is still exact."""
    server = await engine_for(tokens_router(think_peer, qwen3_dir, "vllm"))
    think_peer.script.extend(PLAIN)
    await http_chain(server, 3)
    assert_exact(think_peer)
    assert counters(server)["create.resent"] == 2
    assert counters(server)["resend.raw_held"] == 1 + 3


@pytest.mark.parametrize("changed", ["order", "text"])
async def test_an_earlier_item_sent_in_other_bytes(
    engine_for: StartEngine, think_peer: TokenPeer, qwen3_dir: Path, changed: str
) -> None:
    """COMPAT-7, COMPAT-8: the third turn sends its first item in other bytes, the items after
    it as before. Its keys reordered, it is decoded again and still matches (the turn
    continues exactly); its text edited, nothing of the earlier inputs is taken for it (their
    later items' bytes are equal, not the list's) and the history is rendered afresh, reading
    the edit."""
    server = await engine_for(tokens_router(think_peer, qwen3_dir, "vllm"))
    think_peer.script.extend(PLAIN)
    _, history = await http_chain(server, 2)
    if changed == "order":
        history[0] = {"content": "Weather?", "role": "user"}
    else:
        history[0] = {"role": "user", "content": "Weather in Rome?"}
    await post(server, {"model": "model-a", "input": history, "tools": [WEATHER], "store": False})
    if changed == "order":
        assert think_peer.extends(2) == 1
        assert counters(server)["create.resent"] == 2
    else:
        assert "Weather in Rome?" in think_peer.text(think_peer.turns[2].prompt)
        assert think_peer.extends(2) is None
        assert counters(server)["create.resent"] == 1
    assert counters(server)["resend.raw_held"] == 1  # the second turn's only


async def test_a_held_prefix_keeps_the_requests_own_indexes_and_sizes(
    engine_for: StartEngine, think_peer: TokenPeer, qwen3_dir: Path
) -> None:
    """COMPAT-7 with LEN-*: after a held prefix, a malformed new item is named by its index in
    the request's own ``input``, and the held items' characters count toward the input's
    limit as when they were decoded (the new items alone are within it)."""
    question = "Weather? " + "x" * 80
    server = await engine_for(tokens_router(think_peer, qwen3_dir, "vllm"), max_input_chars=100)
    think_peer.script.extend(PLAIN[:1])
    first = {"model": "model-a", "tools": [WEATHER], "store": False}
    answer = await post(server, {**first, "input": [{"role": "user", "content": question}]})
    history = [{"role": "user", "content": question}, *answer["output"]]
    bad = {"type": "function_call_output", "call_id": 5, "output": "sunny"}
    error = (await post(server, {**first, "input": [*history, bad]}, status=400))["error"]
    assert error["param"] == "input[2].call_id", error
    output = {"type": "function_call_output", "call_id": history[1]["call_id"], "output": "sun"}
    error = (await post(server, {**first, "input": [*history, output]}, status=400))["error"]
    assert error["code"] == "input_too_large", error
    assert counters(server)["resend.raw_held"] == 2
    assert len(think_peer.turns) == 1


async def test_the_identical_list_with_the_creates_header_is_taken(
    engine_for: StartEngine, think_peer: TokenPeer, qwen3_dir: Path
) -> None:
    """COMPAT-7, PIPE-4 (the deep fuzz's seed 250566750, shrunk): two published lists hold the
    same items (``sm`` and its echo), the older one under other instructions. A resend without
    instructions continues the one whose header it shares, exactly as its own
    ``previous_response_id`` would: never the other, whose header change re-renders the
    whole history (the sampled ids lost)."""
    server = await engine_for(tokens_router(think_peer, qwen3_dir, "vllm"))
    first = [{"role": "user", "content": "sm"}]
    other = await post(server, {"model": "model-a", "input": first, "instructions": "Hi"})
    assert "Hi" in think_peer.text(think_peer.turns[0].prompt)
    answer = await post(server, {"model": "model-a", "input": first, "store": False})
    assert other["output"][0]["content"] == answer["output"][0]["content"]  # the same items
    history = [*first, *answer["output"], {"role": "user", "content": "0"}]
    await post(server, {"model": "model-a", "input": history, "store": False})
    assert think_peer.extends(2) == 1, think_peer.text(think_peer.turns[2].prompt)
    assert counters(server)["create.resent"] == 1
