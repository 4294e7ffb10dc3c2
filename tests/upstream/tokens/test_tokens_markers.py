"""TOK-30: a parser's markers reach it whether the tokenizer marks them special or not, and
text never shows end-of-turn or control tokens. Both tokenizer shapes, through the real server
and the openai SDK over HTTP and WebSocket: the hermes call arrives as a ``function_call`` and
the chain stays token-exact."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st
from openai import AsyncOpenAI
from tokenizers import AddedToken, Tokenizer

from engine.models.tokens.tokenizer import ModelTokenizer, load_tokenizer
from engine.models.tokens.tool_parsers import PARSERS
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


async def test_a_malformed_call_stays_text_and_is_counted(
    shaped_peer: TokenPeer, shaped_tokenizer: Path, engine_for: StartEngine
) -> None:
    """PARSE-3 through the server: the sampled text is the message, the counter is in
    ``/metrics``."""
    server = await engine_for(tokens_router(shaped_peer, shaped_tokenizer, "vllm"))
    shaped_peer.script.append("<tool_call>{not json}</tool_call>")
    client = AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    try:
        response = await client.responses.create(model="model-a", input="Hi", tools=[WEATHER])
    finally:
        await client.close()
    assert [item.type for item in response.output] == ["message"]
    assert response.output_text == "<tool_call>{not json}</tool_call>"
    url = server.base_url.removesuffix("/v1") + "/metrics"
    async with aiohttp.ClientSession() as http, http.get(url) as resp:
        metrics = await resp.text()
    assert 'rollout_events_total{event="tokens.malformed_call.hermes"} 1.0' in metrics


@functools.cache
def _loaded(directory: Path) -> ModelTokenizer:
    return load_tokenizer(str(directory))


ANSWER = (
    'Let me look. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n'
    "</tool_call><tool_call>{broken}</tool_call> done<|im_end|>"
)


@given(st.lists(st.integers(1, 6), min_size=1, max_size=40))
def test_any_grouping_of_the_sampled_ids_gives_the_same_items(
    shaped_tokenizer: Path, groups: list[int]
) -> None:
    """PARSE-1 at the id level: the sampled ids, decoded one by one (markers kept, control
    tokens hidden) and handed to the parser in any grouping, give the same items."""
    tokenizer = _loaded(shaped_tokenizer)
    hidden = tokenizer.hidden_ids(TAGS)
    ids = tokenizer.encode(ANSWER)

    def items(sizes: list[int]) -> list[tuple[str, str]]:
        decoder, parser = tokenizer.decoder(hidden), PARSERS["hermes"]({})
        deltas: list[Any] = []
        at = 0
        for size in [*sizes, len(ids)]:
            deltas += parser.feed("".join(decoder.step(i) for i in ids[at : at + size]))
            at += size
        deltas += parser.finish()
        return [(type(d).__name__, getattr(d, "text", getattr(d, "name", ""))) for d in deltas]

    whole = items([len(ids)])
    assert [kind for kind, _ in whole].count("CallStart") == 1
    assert ("ArgsDelta", '{"city": "Zürich"}') in whole
    merged_text = "".join(text for kind, text in whole if kind == "TextDelta")
    assert merged_text == "Let me look. <tool_call>{broken}</tool_call> done"
    grouped = items(groups)
    assert [k for k, _ in grouped].count("CallStart") == 1
    assert "".join(t for k, t in grouped if k == "TextDelta") == merged_text
    assert [t for k, t in grouped if k == "ArgsDelta"] == [t for k, t in whole if k == "ArgsDelta"]
