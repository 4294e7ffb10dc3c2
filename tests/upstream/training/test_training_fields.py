"""Training fields on items (TOK-60..TOK-64), end to end against the token peer (TOK-42):
each sampling step's last item carries its whole prompt, its sampled ids and their logprobs
(NeMo Gym's ``prompt_token_ids``, ``generation_token_ids``, ``generation_log_probs``), asked by
``include`` or by the route, over HTTP JSON, SSE and WebSocket, however the step ends; a
stateless resend that carries them back continues exactly (checked at the peer: every prompt
is the previous prompt, its answer and the new items' ids), and carried ids that do not fit
are a 400 naming the field."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from engine.conversation.carried import MAX_CARRIED_IDS
from tests.support.server import LiveServer
from tests.support.tools import WEATHER
from tests.support.wait import wait_for
from tests.upstream.conftest import StartEngine
from tests.upstream.reasoning_peer import HARMONY_CHAIN as HARMONY
from tests.upstream.reasoning_peer import PLAIN_CHAIN as PLAIN
from tests.upstream.reasoning_peer import THINK_CHAIN as THINK
from tests.upstream.reasoning_peer import HarmonyPeer, harmony_router
from tests.upstream.token_peer import TokenPeer, assert_exact, tokens_router

FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")
INCLUDE = ["output[*].token_ids"]


@pytest.fixture
def peer(think_peer: TokenPeer) -> TokenPeer:
    """The Qwen3-template peer (conftest's ``think_peer``)."""
    return think_peer


def client_of(server: LiveServer) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)


def logprobs_of(peer: TokenPeer, n: int) -> list[float]:
    return [peer._logprob(k) for k in range(len(peer.turns[n].answer))]


def assert_fields(item: dict[str, Any], peer: TokenPeer, n: int) -> None:
    """TOK-60: the item carries turn ``n``'s whole prompt and answer as the peer saw them."""
    assert item["prompt_token_ids"] == peer.turns[n].prompt
    assert item["generation_token_ids"] == peer.turns[n].answer
    assert item["generation_log_probs"] == logprobs_of(peer, n)


def only_last(output: list[dict[str, Any]]) -> None:
    assert all(field in output[-1] for field in FIELDS), output[-1]
    for item in output[:-1]:
        assert not any(field in item for field in FIELDS), item


def follow_up(history: list[dict[str, Any]], output: list[dict[str, Any]]) -> None:
    """The output as the client got it (fields included), then the tool's answer or a thanks."""
    history += output
    last = output[-1]
    if last["type"] == "function_call":
        history.append(
            {"type": "function_call_output", "call_id": last["call_id"], "output": "sunny"}
        )
    else:
        history.append({"role": "user", "content": "Thanks"})


async def http_chain(
    server: LiveServer, turns: int, include: list[str] | None = INCLUDE
) -> list[dict[str, Any]]:
    """``turns`` stateless creates (``store: false``, the whole history each time, the training
    fields sent back as received), as plain JSON."""
    history: list[dict[str, Any]] = [{"role": "user", "content": "Weather?"}]
    answers: list[dict[str, Any]] = []
    async with aiohttp.ClientSession() as http:
        for _ in range(turns):
            body: dict[str, Any] = {
                "model": "model-a", "input": history, "tools": [WEATHER], "store": False
            }  # fmt: skip
            if include is not None:
                body["include"] = include
            async with http.post(f"{server.base_url}/responses", json=body) as resp:
                answer = await resp.json()
                assert resp.status == 200, answer
            answers.append(answer)
            follow_up(history, answer["output"])
    return answers


@pytest.mark.parametrize(("parser", "script"), [("think", THINK), (None, PLAIN)])
async def test_stateless_resend_with_fields_is_exact_over_http(
    engine_for: StartEngine, peer: TokenPeer, qwen3_dir: Path, parser: str | None, script: list[str]
) -> None:
    """TOK-60, TOK-62: three stateless turns, the fields sent back each time: every prompt at
    the peer is the previous prompt, its answer and the new items' ids, and each response's
    last item carries what the peer saw (``think`` and a plain tool-calling model, for which
    nothing else carries the ids, SEAL-8)."""
    extra = {"reasoning_parser": parser} if parser else {}
    server = await engine_for(tokens_router(peer, qwen3_dir, "vllm", **extra))
    peer.script.extend(script)
    answers = await http_chain(server, 3)
    assert_exact(peer)
    for n, answer in enumerate(answers):
        only_last(answer["output"])
        assert_fields(answer["output"][-1], peer, n)
        if n:  # NeMo Gym's contiguity check (token_id_capture/builder.py)
            before = answers[n - 1]["output"][-1]
            head = before["prompt_token_ids"] + before["generation_token_ids"]
            assert answer["output"][-1]["prompt_token_ids"][: len(head)] == head
    assert server.engine.router.backend_of("model-a").stats["render.carried"] == 2


async def test_harmony_stateless_resend_with_fields_is_exact(
    engine_for: StartEngine, harmony_peer: HarmonyPeer
) -> None:
    """TOK-60, TOK-62 with harmony's encoding and channels."""
    server = await engine_for(harmony_router(harmony_peer))
    harmony_peer.script.extend(HARMONY)
    answers = await http_chain(server, 3)
    assert_exact(harmony_peer)
    for n, answer in enumerate(answers):
        only_last(answer["output"])
        assert answer["output"][-1]["prompt_token_ids"] == harmony_peer.turns[n].prompt
        assert answer["output"][-1]["generation_token_ids"] == harmony_peer.turns[n].answer


async def test_without_the_fields_or_the_context_a_resend_renders_afresh(
    engine_for: StartEngine, peer: TokenPeer, qwen3_dir: Path
) -> None:
    """TOK-61, TOK-62: not asked, no item carries them, and on a process that holds no
    context to continue (the hydration cache off, so no resend is matched, COMPAT-7) the same
    resend is rendered by the template, which the peer sees as not exact (the exact chains owe
    it to the fields)."""
    server = await engine_for(tokens_router(peer, qwen3_dir, "vllm"), hydration_cache_bytes=0)
    peer.script.extend(PLAIN[:2])
    answers = await http_chain(server, 2, include=None)
    for answer in answers:
        assert not any(f in item for item in answer["output"] for f in FIELDS)
    assert peer.extends(1) is None


async def test_the_route_setting_gives_them_without_include(
    engine_for: StartEngine, peer: TokenPeer, qwen3_dir: Path
) -> None:
    """TOK-61: ``training_fields = true`` on the route: a client that asks nothing (NeMo Gym's
    request body) gets them and its resend continues exactly."""
    router = tokens_router(peer, qwen3_dir, "vllm", training_fields=True)
    server = await engine_for(router)
    peer.script.extend(PLAIN)
    answers = await http_chain(server, 3, include=None)
    assert_exact(peer)
    for n, answer in enumerate(answers):
        assert_fields(answer["output"][-1], peer, n)


async def test_sse_and_the_sdk_carry_them(
    engine_for: StartEngine, peer: TokenPeer, qwen3_dir: Path
) -> None:
    """TOK-60 over SSE, parsed by the openai SDK: the step's last ``output_item.done`` and
    ``response.completed`` carry the fields (extra fields on its models), no other item does;
    the events stay numbered in order though the last ``done`` waited for the step's end."""
    server = await engine_for(tokens_router(peer, qwen3_dir, "vllm", reasoning_parser="think"))
    peer.script.extend(THINK[:1])
    async with client_of(server) as client:
        stream = await client.responses.create(
            model="model-a",
            input="Weather?",
            tools=[WEATHER],
            stream=True,
            include=INCLUDE,
        )
        events = [event async for event in stream]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    done = [e.item.model_dump() for e in events if e.type == "response.output_item.done"]
    assert [d["type"] for d in done] == ["reasoning", "function_call"]
    assert "prompt_token_ids" not in done[0] or done[0]["prompt_token_ids"] is None
    assert_fields(done[-1], peer, 0)
    completed = events[-1]
    assert completed.type == "response.completed"
    assert_fields(completed.response.output[-1].model_dump(), peer, 0)


async def test_websocket_store_false_resend_is_exact(
    engine_for: StartEngine, peer: TokenPeer, qwen3_dir: Path
) -> None:
    """TOK-60, TOK-62 over the SDK's WebSocket with ``store: false`` and the whole input each
    time: ``output_item.done`` carries the fields, and sent back they continue exactly."""
    server = await engine_for(tokens_router(peer, qwen3_dir, "vllm"))
    peer.script.extend(PLAIN)
    history: list[dict[str, Any]] = [{"role": "user", "content": "Weather?"}]
    async with client_of(server) as client, client.responses.connect() as conn:
        for n in range(3):
            await conn.response.create(
                model="model-a",
                input=history,
                tools=[WEATHER],
                store=False,
                include=INCLUDE,
            )
            done: list[dict[str, Any]] = []
            async for event in conn:
                assert event.type not in ("error", "response.failed"), event
                if event.type == "response.output_item.done":
                    done.append(event.item.model_dump(exclude_none=True))
                if event.type == "response.completed":
                    break
            assert_fields(done[-1], peer, n)
            follow_up(history, done)
    assert_exact(peer)


async def test_a_turn_cut_by_the_output_limit_carries_them(
    engine_for: StartEngine, peer: TokenPeer, qwen3_dir: Path
) -> None:
    """TOK-60 (length), TOK-62: the cut message (``incomplete``) carries the cut answer; sent
    back, the next prompt is that prompt, the cut ids, the template's whole close and the new
    items."""
    server = await engine_for(tokens_router(peer, qwen3_dir, "vllm"))
    peer.script.extend(["It is sunny in Paris today.", "Bye."])
    history: list[dict[str, Any]] = [{"role": "user", "content": "Weather?"}]
    async with client_of(server) as client:
        cut = await client.responses.create(
            model="model-a",
            input=history,
            store=False,
            max_output_tokens=5,
            include=INCLUDE,
        )
        assert cut.status == "incomplete"
        item = cut.output[-1].model_dump(exclude_none=True)
        assert item["status"] == "incomplete"
        assert peer.turns[0].cut
        assert_fields(item, peer, 0)
        follow_up(history, [item])
        await client.responses.create(model="model-a", input=history, store=False)
    assert_exact(peer)


async def test_a_cancelled_turn_carries_them(
    engine_for: StartEngine, peer: TokenPeer, qwen3_dir: Path
) -> None:
    """TOK-60 (cancel): a background response cancelled mid-answer keeps its cut item, which
    carries what was sampled (the peer's first chunk)."""
    server = await engine_for(tokens_router(peer, qwen3_dir, "vllm"))
    peer.resume.clear()
    peer.script.append("It is sunny in Paris today.")
    try:
        async with client_of(server) as client:
            running = await client.responses.create(
                model="model-a",
                input="Weather?",
                background=True,
                include=INCLUDE,
            )
            await wait_for(peer.paused.is_set, "the peer mid-answer")
            cancelled = await client.responses.cancel(running.id)
            assert cancelled.status == "cancelled"
            peer.resume.set()

            async def ended() -> Any:
                got = await client.responses.retrieve(running.id)
                return got if got.output else None

            kept = (await wait_for(ended, "the cancelled response's output")).output[-1]
            item = kept.model_dump(exclude_none=True)
            assert item["prompt_token_ids"] == peer.turns[0].prompt
            assert item["generation_token_ids"] == peer.turns[0].answer[:3]
    finally:
        peer.resume.set()


# ---------------------------------------------------------------------- TOK-63: refused


async def first_turn(server: LiveServer, peer: TokenPeer) -> list[dict[str, Any]]:
    """A first turn's whole history to send back: the user's question, the call (with its
    fields) and the tool's answer."""
    peer.script.append(PLAIN[0])
    (answer,) = await http_chain(server, 1)
    history: list[dict[str, Any]] = [{"role": "user", "content": "Weather?"}]
    follow_up(history, answer["output"])
    return history


async def refused(server: LiveServer, history: list[dict[str, Any]]) -> dict[str, Any]:
    body = {"model": "model-a", "input": history, "tools": [WEATHER], "store": False}
    data = io.BytesIO(json.dumps(body).encode())  # a large body is streamed (aiohttp)
    headers = {"Content-Type": "application/json"}
    url = f"{server.base_url}/responses"
    async with aiohttp.ClientSession() as http, http.post(url, data=data, headers=headers) as resp:
        answer: dict[str, Any] = await resp.json()
        assert resp.status == 400, answer
    assert answer["error"]["code"] == "invalid_value"
    return answer["error"]


def tampered(history: list[dict[str, Any]], **fields: Any) -> list[dict[str, Any]]:
    edited = [dict(item) for item in history]
    edited[1].update(fields)
    return edited


async def test_carried_ids_that_do_not_fit_are_refused(
    engine_for: StartEngine, peer: TokenPeer, qwen3_dir: Path
) -> None:
    """TOK-63, TOK-64: a prompt id changed, arguments edited under their ids, an id outside the
    vocabulary, too many ids, a missing field, a logprob short: each a 400 ``invalid_value``
    whose ``param`` names the field of ``input[1]``, and the peer never asked."""
    server = await engine_for(tokens_router(peer, qwen3_dir, "vllm"))
    history = await first_turn(server, peer)
    call = history[1]
    prompt, ids = call["prompt_token_ids"], call["generation_token_ids"]
    cases = [
        ("prompt_token_ids", "not this route's prompt", [prompt[0] + 1, *prompt[1:]], None),
        ("prompt_token_ids", "vocabulary", [*prompt[:-1], 10**6], None),
        ("prompt_token_ids", "more than", [0] * (MAX_CARRIED_IDS + 1), None),
        ("prompt_token_ids", "negative", [-1, *prompt[1:]], None),
        ("generation_token_ids", "do not read", None, '{"city": "Rome"}'),
        ("generation_token_ids", "vocabulary", [*ids[:-1], 10**6], None),
        ("generation_log_probs", "one logprob", call["generation_log_probs"][:-1], None),
        ("generation_log_probs", "together", None, None),
    ]
    for field, why, value, arguments in cases:
        if arguments is not None:
            body = tampered(history, arguments=arguments)
        elif value is not None:
            body = tampered(history, **{field: value})
        else:
            body = [history[0], {k: v for k, v in call.items() if k != field}, history[2]]
        error = await refused(server, body)
        assert error["param"] == f"input[1].{field}", (field, error)
        assert why in error["message"], (why, error)
    assert len(peer.turns) == 1


async def test_ids_of_another_route_are_refused(
    engine_for: StartEngine, peer: TokenPeer, harmony_peer: HarmonyPeer, qwen3_dir: Path
) -> None:
    """TOK-63: fields a harmony route gave, sent to a Qwen route with the same items, are not
    that route's prompt: 400 naming ``input[1].prompt_token_ids``, nothing sampled."""
    harmony = await engine_for(harmony_router(harmony_peer))
    harmony_peer.script.append(HARMONY[0])
    (answer,) = await http_chain(harmony, 1)
    history: list[dict[str, Any]] = [{"role": "user", "content": "Weather?"}]
    follow_up(history, answer["output"])
    qwen = await engine_for(tokens_router(peer, qwen3_dir, "vllm", reasoning_parser="think"))
    error = await refused(qwen, history)
    assert error["param"].startswith("input[") and error["param"].endswith("_token_ids")
    assert not peer.turns


async def test_the_openai_sdk_sends_them_back(
    engine_for: StartEngine, peer: TokenPeer, qwen3_dir: Path
) -> None:
    """TOK-60, TOK-62: the SDK parses the items (the fields are extra fields of its models)
    and ``model_dump`` sends them back: the resend is exact."""
    server = await engine_for(tokens_router(peer, qwen3_dir, "vllm"))
    peer.script.extend(PLAIN[:2])
    async with client_of(server) as client:
        history: list[Any] = [{"role": "user", "content": "Weather?"}]
        first = await client.responses.create(
            model="model-a",
            input=history,
            tools=[WEATHER],
            store=False,
            include=INCLUDE,
        )
        call = first.output[-1]
        assert call.model_extra is not None and "generation_token_ids" in call.model_extra
        history += [item.model_dump(exclude_none=True) for item in first.output]
        history.append({"type": "function_call_output", "call_id": call.call_id, "output": "x"})
        second = await client.responses.create(
            model="model-a", input=history, tools=[WEATHER], store=False
        )
        assert second.status == "completed"
    assert_exact(peer)
    with pytest.raises(openai.BadRequestError):
        async with client_of(server) as client:
            history[1]["generation_log_probs"] = []
            await client.responses.create(model="model-a", input=history, store=False)


async def test_carried_fields_stay_off_the_stored_input(
    engine_for: StartEngine, peer: TokenPeer, qwen3_dir: Path
) -> None:
    """TOK-62: the fields sent back are taken off the items: a stored response lists its input
    without them (the ids are stored once, with the response that sampled them)."""
    server = await engine_for(tokens_router(peer, qwen3_dir, "vllm"))
    history = await first_turn(server, peer)
    async with client_of(server) as client:
        second = await client.responses.create(
            model="model-a",
            input=history,
            tools=[WEATHER],
            store=True,
        )
        listed = await client.responses.input_items.list(second.id)
    items = [item.model_dump() for item in listed.data]
    assert any(item["type"] == "function_call" for item in items)
    assert not any(field in item for item in items for field in FIELDS)
    assert_exact(peer)
