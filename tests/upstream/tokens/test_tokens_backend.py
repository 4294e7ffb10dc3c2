"""The ``tokens`` backend against the token peer (TOK-1..TOK-9): the openai SDK runs a tool
chain over HTTP and WebSocket through each upstream API, and the peer checks that every turn's
prompt is the previous prompt plus what it sampled, exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
from openai import AsyncOpenAI

from tests.support.tools import WEATHER
from tests.upstream.conftest import StartEngine
from tests.upstream.token_peer import (
    TokenPeer,
    assert_exact,
    backend_of,
    make_tokenizer,
    tokens_router,
)

APIS = ["vllm", "sglang", "llamacpp"]


async def http_chain(client: AsyncOpenAI, turns: int, store: bool = True) -> list[str]:
    answers: list[str] = []
    previous: str | None = None
    for turn in range(turns):
        response = await client.responses.create(
            model="model-a",
            input=f"Weather, turn {turn}?",
            tools=[WEATHER],
            previous_response_id=previous,
            store=store,
        )
        call = response.output[-1]
        assert call.type == "function_call" and call.name == "get_weather", response.output
        assert call.arguments == '{"city": "Paris"}'
        response = await client.responses.create(
            model="model-a",
            previous_response_id=response.id,
            input=[
                {"type": "function_call_output", "call_id": call.call_id, "output": f"sun-{turn}"}
            ],
            tools=[WEATHER],
            store=store,
        )
        answers.append(response.output_text)
        previous = response.id
    return answers


@pytest.mark.parametrize("api", APIS)
async def test_http_tool_chain_is_token_exact(
    api: str, token_peer: TokenPeer, tokenizer_dir: Path, engine_for: StartEngine
) -> None:
    server = await engine_for(tokens_router(token_peer, tokenizer_dir, api))
    client = AsyncOpenAI(base_url=server.base_url, api_key="unused")
    try:
        answers = await http_chain(client, turns=2)
    finally:
        await client.close()
    assert answers == ["Tool said: sun-0", "Tool said: sun-1"]
    assert [t.api for t in token_peer.turns] == [api] * 4
    assert_exact(token_peer)
    stats = backend_of(server).stats
    assert stats["render.full"] == 1 and stats["render.incremental"] == 3
    assert stats["drift.answer"] == 0 and stats["drift.render"] == 0


async def test_rerender_route_renders_the_whole_history_every_turn(
    token_peer: TokenPeer, tokenizer_dir: Path, engine_for: StartEngine
) -> None:
    """TOK-4: ``history = "rerender"`` sends the template's rendering of the whole conversation
    every turn, as a chat server would, instead of extending the sampled ids."""
    router = tokens_router(token_peer, tokenizer_dir, "vllm", history="rerender")
    server = await engine_for(router)
    client = AsyncOpenAI(base_url=server.base_url, api_key="unused")
    try:
        assert await http_chain(client, turns=1) == ["Tool said: sun-0"]
    finally:
        await client.close()
    stats = backend_of(server).stats
    assert stats["render.full"] == 2 and stats["render.incremental"] == 0
    backend = backend_of(server)
    second = token_peer.text(token_peer.turns[1].prompt)
    assert second.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert second.startswith(backend.tokenizer.decode(token_peer.turns[0].prompt))
    # The peer sampled its call one character at a time (TOK-42): the re-render encodes the
    # same text canonically, so the prefix check catches it, though the template is
    # append-only and the text is the same. The check can fail; an exact route passes it.
    first = token_peer.turns[0]
    assert token_peer.text(token_peer.turns[1].prompt).startswith(
        token_peer.text(first.prompt + first.answer)
    )
    assert token_peer.extends(1) is None
    with pytest.raises(AssertionError):
        assert_exact(token_peer)


def test_a_template_that_is_not_append_only_is_detected(tmp_path: Path) -> None:
    """TOK-4: the load-time probe tells an append-only template from one that rewrites what
    came before (here: the latest assistant turn is marked)."""
    from engine.models.tokens.tokenizer import load_tokenizer
    from tests.upstream.token_peer import QWEN_TEMPLATE

    marked = QWEN_TEMPLATE.replace(
        "{{- '<|im_start|>assistant' }}",
        "{{- '<|im_start|>assistant' + (' (latest)' if loop.last else '') }}",
    )
    assert load_tokenizer(str(make_tokenizer(tmp_path / "a"))).shape.append_only
    assert not load_tokenizer(str(make_tokenizer(tmp_path / "b", marked))).shape.append_only
