"""TOK-30: a parser's markers reach it whether the tokenizer marks them special or not, and
text never shows end-of-turn or control tokens. Both tokenizer shapes, through the real server
and the openai SDK over HTTP and WebSocket: the hermes call arrives as a ``function_call`` and
the chain stays token-exact."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI
from tokenizers import AddedToken, Tokenizer

from engine.models.tokens.tokenizer import load_tokenizer
from tests.support.tools import WEATHER
from tests.upstream.conftest import StartEngine
from tests.upstream.token_peer import TokenPeer, assert_exact, make_tokenizer, tokens_router

TAGS = ["<tool_call>", "</tool_call>"]


@pytest.fixture(scope="module", params=["plain", "special"])
def shaped_tokenizer(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The test tokenizer; ``special``: with ``<tool_call>``/``</tool_call>`` added as special
    tokens, as several Hermes fine-tunes ship them."""
    directory = make_tokenizer(tmp_path_factory.mktemp(request.param))
    if request.param == "special":
        file = directory / "tokenizer.json"
        tokenizer = Tokenizer.from_file(str(file))
        tokenizer.add_special_tokens([AddedToken(tag, special=True) for tag in TAGS])
        tokenizer.save(str(file))
    return directory


@pytest.fixture
async def shaped_peer(shaped_tokenizer: Path) -> AsyncIterator[TokenPeer]:
    peer = TokenPeer(shaped_tokenizer)
    await peer.start()
    try:
        yield peer
    finally:
        await peer.stop()


def _tag_ids(peer: TokenPeer) -> set[int]:
    specials = peer.tokenizer.get_added_tokens_decoder()
    return {i for i, t in specials.items() if t.content in TAGS and t.special}


async def _created(conn: Any) -> Any:
    async for event in conn:
        assert event.type not in ("error", "response.failed"), event
        if event.type == "response.completed":
            return event.response
    raise AssertionError("the connection closed")


async def http_round(client: AsyncOpenAI) -> tuple[Any, Any]:
    first = await client.responses.create(model="model-a", input="Weather?", tools=[WEATHER])
    call = first.output[-1]
    assert call.type == "function_call", first.output
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "sun"}
    second = await client.responses.create(
        model="model-a", previous_response_id=first.id, input=[output], tools=[WEATHER]
    )
    return first, second


async def ws_round(client: AsyncOpenAI) -> tuple[Any, Any]:
    async with client.responses.connect() as conn:
        await conn.response.create(model="model-a", input="Weather?", tools=[WEATHER], store=False)
        first = await _created(conn)
        call = first.output[-1]
        assert call.type == "function_call", first.output
        output = {"type": "function_call_output", "call_id": call.call_id, "output": "sun"}
        await conn.response.create(
            model="model-a",
            previous_response_id=first.id,
            input=[output],
            tools=[WEATHER],
            store=False,
        )
        return first, await _created(conn)


@pytest.mark.parametrize("transport", ["http", "ws"])
async def test_tool_tags_plain_or_special_make_a_function_call(
    transport: str, shaped_peer: TokenPeer, shaped_tokenizer: Path, engine_for: StartEngine
) -> None:
    server = await engine_for(tokens_router(shaped_peer, shaped_tokenizer, "vllm"))
    client = AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    try:
        first, second = await (http_round if transport == "http" else ws_round)(client)
    finally:
        await client.close()
    call = first.output[-1]
    assert [item.type for item in first.output] == ["function_call"]
    assert call.name == "get_weather" and call.arguments == '{"city": "Paris"}'
    assert second.output_text == "Tool said: sun"
    sampled = set(shaped_peer.turns[0].answer)
    if shaped_tokenizer.name.startswith("special"):  # the tags really were special tokens
        assert _tag_ids(shaped_peer) <= sampled and len(_tag_ids(shaped_peer)) == 2
    else:
        assert not _tag_ids(shaped_peer)
    assert_exact(shaped_peer)


async def test_control_tokens_never_reach_the_text(
    shaped_peer: TokenPeer, shaped_tokenizer: Path, engine_for: StartEngine
) -> None:
    """Special tokens that are no parser's marker (here ``<|endoftext|>`` and
    ``<|im_start|>`` sampled mid-answer) are kept in the trajectory but never shown."""
    server = await engine_for(tokens_router(shaped_peer, shaped_tokenizer, "vllm"))
    shaped_peer.script.append("Hi<|endoftext|> there<|im_start|>!")
    client = AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    try:
        response = await client.responses.create(model="model-a", input="Hello")
    finally:
        await client.close()
    assert response.output_text == "Hi there!"
    control = {shaped_peer.tokenizer.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>")}
    assert control <= set(shaped_peer.turns[0].answer)


def test_only_the_parsers_markers_are_shown(shaped_tokenizer: Path) -> None:
    tokenizer = load_tokenizer(str(shaped_tokenizer))
    hidden = tokenizer.hidden_ids(TAGS)
    names = {tokenizer.tokenizer.id_to_token(i) for i in hidden}
    assert names == {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}
    ids = tokenizer.encode("a<tool_call>b<|im_end|>")
    decoder = tokenizer.decoder(hidden)
    assert "".join(decoder.step(i) for i in ids) == "a<tool_call>b"
