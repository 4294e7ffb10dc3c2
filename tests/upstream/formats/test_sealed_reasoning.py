"""Reasoning that travels sealed (SEAL-1..SEAL-8), end to end with the openai SDK against the
token peer: ``include: ["reasoning.encrypted_content"]`` seals each reasoning item; a stateless
continuation (``store: false``, the whole input again) that carries the blobs back is exact
(each prompt the previous prompt plus the sampled ids, TOK-42's peer), with the ``think``
parser and with harmony, over HTTP and WebSocket, and on a second node holding the same key; a
tampered, truncated or foreign blob is 400 ``invalid_encrypted_content`` naming the item."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from engine.conversation.sealed import KeyRing, SealedReasoning
from engine.core import EngineConfig
from engine.server.transport.server_config import ServerConfig
from tests.support.server import LiveServer, start_server
from tests.support.tools import WEATHER
from tests.upstream.conftest import StartEngine
from tests.upstream.reasoning_peer import HARMONY_CHAIN as HARMONY_SCRIPT
from tests.upstream.reasoning_peer import THINK_CHAIN as THINK_SCRIPT
from tests.upstream.reasoning_peer import HarmonyPeer, harmony_router
from tests.upstream.token_peer import TokenPeer, assert_exact, backend_of, tokens_router

INCLUDE = ["reasoning.encrypted_content"]


def key_file(path: Path, *keys: bytes) -> Path:
    path.write_text("# reasoning keys\n" + "".join(k.hex() + "\n" for k in keys))
    return path


def client_of(server: LiveServer, key: str = "x") -> AsyncOpenAI:
    return AsyncOpenAI(base_url=server.base_url, api_key=key, max_retries=0)


def dumped(response: Any) -> list[dict[str, Any]]:
    """The output items as a stateless client sends them back (what the SDK round-trips)."""
    return [item.model_dump(exclude_none=True) for item in response.output]


async def stateless_chain(servers: list[LiveServer], turns: int = 3) -> list[Any]:
    """Weather? -> (reasoning, call) -> output -> (reasoning, answer) -> Thanks -> (reasoning,
    answer), each create ``store: false`` with the whole input, turn n on ``servers[n % len]``."""
    history: list[dict[str, Any]] = [{"role": "user", "content": "Weather?"}]
    responses: list[Any] = []
    for n in range(turns):
        async with client_of(servers[n % len(servers)]) as client:
            response = await client.responses.create(
                model="model-a", input=history, tools=[WEATHER], store=False, include=INCLUDE
            )
        responses.append(response)
        history += dumped(response)
        last = response.output[-1]
        if last.type == "function_call":
            history.append(
                {"type": "function_call_output", "call_id": last.call_id, "output": "sunny"}
            )
        else:
            history.append({"role": "user", "content": "Thanks"})
    return responses


def assert_sealed(responses: list[Any]) -> None:
    """SEAL-1: every reasoning item carries a blob of ours, its text still in the clear."""
    reasoning = [i for r in responses for i in r.output if i.type == "reasoning"]
    assert len(reasoning) == len(responses)
    for item in reasoning:
        assert item.encrypted_content.startswith("rseal1.")
        assert item.content[0].text
    assert responses[1].output_text == "It is sunny in Paris."


async def test_think_stateless_chain_is_exact_over_http(
    engine_for: StartEngine, think_peer: TokenPeer, qwen3_dir: Path, tmp_path: Path
) -> None:
    """SEAL-1, SEAL-3, SEAL-4: three stateless turns, each prompt the previous prompt plus the
    ids the peer sampled (it samples a character at a time, so a re-render would differ). The
    hydration cache is off, so no resend is continued from a context (COMPAT-7): the blobs
    alone make the chain exact, as on a node that never saw the earlier turns."""
    keys = key_file(tmp_path / "keys", os.urandom(32))
    router = tokens_router(think_peer, qwen3_dir, "vllm", reasoning_parser="think")
    server = await engine_for(router, reasoning_key_file=keys, hydration_cache_bytes=0)
    think_peer.script.extend(THINK_SCRIPT)
    responses = await stateless_chain([server])
    assert_sealed(responses)
    assert_exact(think_peer)
    assert backend_of(server).stats["render.sealed"] == 2
    assert server.engine.counters["create.stateless"] == 3


async def test_without_the_include_no_blob_and_a_rerender(
    engine_for: StartEngine, think_peer: TokenPeer, qwen3_dir: Path
) -> None:
    """SEAL-1, SEAL-8: no ``include``, no ``encrypted_content`` (REASON-2); the stateless
    continuation then renders the history with the template (TOK-4), which the peer sees as
    not exact (so the exact chains above owe their exactness to the blobs). The hydration
    cache is off: no context to continue (COMPAT-7)."""
    router = tokens_router(think_peer, qwen3_dir, "vllm", reasoning_parser="think")
    server = await engine_for(router, hydration_cache_bytes=0)
    think_peer.script.extend(THINK_SCRIPT[:2])
    history: list[dict[str, Any]] = [{"role": "user", "content": "Weather?"}]
    async with client_of(server) as client:
        first = await client.responses.create(
            model="model-a", input=history, tools=[WEATHER], store=False
        )
        assert first.output[0].encrypted_content is None
        call = first.output[-1]
        history += [*dumped(first), {"type": "function_call_output", "call_id": call.call_id,
                                     "output": "sunny"}]  # fmt: skip
        await client.responses.create(model="model-a", input=history, tools=[WEATHER], store=False)
    assert think_peer.extends(1) is None


async def test_think_stateless_chain_over_websocket(
    engine_for: StartEngine, think_peer: TokenPeer, qwen3_dir: Path
) -> None:
    """SEAL-1, SEAL-4 over the SDK's WebSocket: ``output_item.done`` carries the blob (what
    Codex keeps), and a ``store: false`` create with the whole input is exact."""
    router = tokens_router(think_peer, qwen3_dir, "vllm", reasoning_parser="think")
    server = await engine_for(router)
    think_peer.script.extend(THINK_SCRIPT[:2])
    history: list[Any] = [{"role": "user", "content": "Weather?"}]
    async with client_of(server) as client, client.responses.connect() as conn:
        for _ in range(2):
            await conn.response.create(
                model="model-a", input=history, tools=[WEATHER], store=False, include=INCLUDE
            )
            done: list[Any] = []
            events: list[Any] = []
            async for event in conn:
                assert event.type not in ("error", "response.failed"), event
                events.append(event)
                if event.type == "response.output_item.done":
                    done.append(event.item.model_dump(exclude_none=True))
                if event.type == "response.completed":
                    break
            assert done[0]["type"] == "reasoning"
            assert done[0]["encrypted_content"].startswith("rseal1.")
            # The held deltas follow the sealed item in order (SEAL-3, ORD-*): numbered
            # 0..n, one item at a time.
            assert [e.sequence_number for e in events] == list(range(len(events)))
            indices = [e.output_index for e in events if hasattr(e, "output_index")]
            assert indices == sorted(indices)
            history += done
            if done[-1]["type"] == "function_call":
                history.append(
                    {
                        "type": "function_call_output",
                        "call_id": done[-1]["call_id"],
                        "output": "sunny",
                    }
                )
    assert_exact(think_peer)


async def test_harmony_stateless_chain_is_exact(
    engine_for: StartEngine, harmony_peer: HarmonyPeer
) -> None:
    """SEAL-3, SEAL-4, HARMONY-2: the same three turns on a harmony route."""
    server = await engine_for(harmony_router(harmony_peer))
    harmony_peer.script.extend(HARMONY_SCRIPT)
    responses = await stateless_chain([server])
    assert_sealed(responses)
    assert_exact(harmony_peer)


async def test_two_nodes_sharing_a_key_file(
    engine_for: StartEngine, think_peer: TokenPeer, qwen3_dir: Path, tmp_path: Path
) -> None:
    """SEAL-5: turns alternate between two nodes holding the same keys, mid-rotation (one
    still seals with the old key, the other already with the new one: each opens the other's
    blobs with its second key) and stay exact; a node with another key refuses (SEAL-7)."""
    new, old = os.urandom(32), os.urandom(32)
    first = await engine_for(
        tokens_router(think_peer, qwen3_dir, "vllm", reasoning_parser="think"),
        reasoning_key_file=key_file(tmp_path / "a", old, new),
    )
    second = await engine_for(
        tokens_router(think_peer, qwen3_dir, "vllm", reasoning_parser="think"),
        reasoning_key_file=key_file(tmp_path / "b", new, old),
    )
    think_peer.script.extend(THINK_SCRIPT)
    responses = await stateless_chain([first, second])
    assert_sealed(responses)
    assert_exact(think_peer)
    other = await engine_for(
        tokens_router(think_peer, qwen3_dir, "vllm", reasoning_parser="think"),
        reasoning_key_file=key_file(tmp_path / "c", os.urandom(32)),
    )
    history = [{"role": "user", "content": "Weather?"}, *dumped(responses[0])]
    async with client_of(other) as client:
        with pytest.raises(openai.BadRequestError) as info:
            await client.responses.create(model="model-a", input=history, store=False)
    assert info.value.code == "invalid_encrypted_content"
    assert info.value.param == "input[1].encrypted_content"


def test_rotation_opens_with_older_keys() -> None:
    """SEAL-5: the first key seals, every key opens; a ring without the key refuses."""
    old, new = os.urandom(32), os.urandom(32)
    blob = KeyRing([old]).seal(SealedReasoning("t", ids=[1, 2]), "owner", "rs_1")
    opened = KeyRing([new, old]).open(blob, "owner", "rs_1")
    assert opened is not None and opened.ids == [1, 2]
    assert KeyRing([new]).open(blob, "owner", "rs_1") is None
    assert KeyRing([new, old]).seal(SealedReasoning("t"), None, "rs_1").split(".")[1] == (
        KeyRing.key_id(new)
    )


def tampered(blob: str, how: str) -> str:
    head, data = blob.rsplit(".", 1)
    if how == "truncated":
        return blob[: len(blob) // 2]
    flipped = "A" if data[5] != "A" else "B"
    return f"{head}.{data[:5]}{flipped}{data[6:]}"


@pytest.mark.parametrize("how", ["tampered", "truncated"])
async def test_tampered_blobs_are_refused_over_http_and_ws(
    engine_for: StartEngine, think_peer: TokenPeer, qwen3_dir: Path, how: str
) -> None:
    """SEAL-7: a blob of ours that does not open is 400 ``invalid_encrypted_content`` with
    ``param`` ``input[i].encrypted_content``, over HTTP and as a WebSocket error event after
    which the socket still serves a create; another blob (not ours) passes untouched (SEAL-6)."""
    router = tokens_router(think_peer, qwen3_dir, "vllm", reasoning_parser="think")
    server = await engine_for(router)
    think_peer.script.extend([THINK_SCRIPT[0], "Fine.", "Fine."])
    async with client_of(server) as client:
        first = await client.responses.create(
            model="model-a", input="Weather?", tools=[WEATHER], store=False, include=INCLUDE
        )
        items = dumped(first)
        items[0]["encrypted_content"] = tampered(items[0]["encrypted_content"], how)
        call = first.output[-1]
        history = [
            {"role": "user", "content": "Weather?"},
            *items,
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
        ]
        with pytest.raises(openai.BadRequestError) as info:
            await client.responses.create(model="model-a", input=history, tools=[WEATHER])
        assert info.value.status_code == 400
        assert info.value.code == "invalid_encrypted_content"
        assert info.value.param == "input[1].encrypted_content"
        assert items[0]["id"] in info.value.message
        async with client.responses.connect() as conn:
            await conn.response.create(model="model-a", input=history, tools=[WEATHER])
            async for event in conn:
                assert event.type == "error", event
                assert event.error.code == "invalid_encrypted_content"
                assert event.error.param == "input[1].encrypted_content"
                break
            items[0]["encrypted_content"] = "gAAAAB-not-ours"  # someone else's: opaque
            await conn.response.create(model="model-a", input=history, tools=[WEATHER])
            async for event in conn:
                assert event.type not in ("error", "response.failed"), event
                if event.type == "response.completed":
                    assert event.response.output_text == "Fine."
                    break


async def test_a_blob_is_foreign_to_another_owner(think_peer: TokenPeer, qwen3_dir: Path) -> None:
    """SEAL-2, SEAL-7: sealed for key A's owner, the blob does not open for key B (nor for A
    under another item id), on one keyed server."""
    router = tokens_router(think_peer, qwen3_dir, "vllm", reasoning_parser="think")
    config = EngineConfig(tokens_per_second=0, default_model="model-a")
    server = await start_server(
        config, router, server=ServerConfig(api_keys=frozenset({"key-a", "key-b"}))
    )
    think_peer.script.extend([THINK_SCRIPT[0], "Fine."])
    try:
        async with client_of(server, "key-a") as a, client_of(server, "key-b") as b:
            first = await a.responses.create(
                model="model-a", input="Weather?", tools=[WEATHER], store=False, include=INCLUDE
            )
            history = [{"role": "user", "content": "Weather?"}, dumped(first)[0]]
            with pytest.raises(openai.BadRequestError) as info:
                await b.responses.create(model="model-a", input=history, store=False)
            assert info.value.code == "invalid_encrypted_content"
            moved = {**history[1], "id": "rs_other"}
            with pytest.raises(openai.BadRequestError) as info:
                await a.responses.create(model="model-a", input=[history[0], moved], store=False)
            assert info.value.param == "input[1].encrypted_content"
            again = await a.responses.create(model="model-a", input=history, store=False)
            assert again.output_text == "Fine."
    finally:
        await server.runner.cleanup()


async def test_input_tokens_opens_the_blob_too(
    engine_for: StartEngine, think_peer: TokenPeer, qwen3_dir: Path
) -> None:
    """SEAL-7: ``POST /v1/responses/input_tokens`` reads the input through the same pipeline."""
    router = tokens_router(think_peer, qwen3_dir, "vllm", reasoning_parser="think")
    server = await engine_for(router)
    think_peer.script.append(THINK_SCRIPT[0])
    async with client_of(server) as client:
        first = await client.responses.create(
            model="model-a", input="Weather?", tools=[WEATHER], store=False, include=INCLUDE
        )
    items = dumped(first)
    items[0]["encrypted_content"] = tampered(items[0]["encrypted_content"], "tampered")
    body = {"model": "model-a", "input": [{"role": "user", "content": "Weather?"}, *items]}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{server.base_url}/responses/input_tokens", json=body) as resp,
    ):
        assert resp.status == 400
        error = (await resp.json())["error"]
    assert error["code"] == "invalid_encrypted_content"


async def test_a_reasoning_item_the_limit_cut_carries_no_blob(
    engine_for: StartEngine, think_peer: TokenPeer, qwen3_dir: Path
) -> None:
    """SEAL-1, ORD-8: ``max_output_tokens`` cuts the reasoning itself: the item ends
    ``incomplete`` and carries no blob, as without the include."""
    router = tokens_router(think_peer, qwen3_dir, "vllm", reasoning_parser="think")
    server = await engine_for(router)
    think_peer.script.append(THINK_SCRIPT[0])
    async with client_of(server) as client:
        cut = await client.responses.create(
            model="model-a",
            input="Weather?",
            tools=[WEATHER],
            store=False,
            include=INCLUDE,
            max_output_tokens=20,
        )
    assert cut.status == "incomplete"
    assert [item.type for item in cut.output] == ["reasoning"]
    assert cut.output[0].status == "incomplete"
    assert cut.output[0].encrypted_content is None
