"""Carried ids are kept as carried (TOK-62): a model may sample a text in ids its tokenizer
would never produce for that text (a word in two tokens where the tokenizer has one), and a
stateless resend that carries them back continues from those ids, never from a re-encoding of
the text. The token peer (TOK-42) is scripted to sample exactly such a split; what it receives
on the next turns is the far side."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
from tokenizers import Tokenizer

from tests.support.server import LiveServer
from tests.upstream.conftest import StartEngine
from tests.upstream.token_peer import TokenPeer, assert_exact, backend_of, tokens_router

TEXT = "It is sunny in Paris."


def split_ids(tokenizer: Tokenizer) -> list[int]:
    """``TEXT`` as a model may sample it: ``Paris`` as ``Par`` + ``is``, the rest canonical.
    The tokenizer encodes the text otherwise (``Paris`` is one token of its own)."""

    def enc(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False).ids)

    ids = enc("It is sunny in ") + enc("Par") + enc("is") + enc(".")
    assert tokenizer.decode(ids) == TEXT
    assert len(enc("Paris")) == 1 and ids != enc(TEXT)  # not the canonical tokenization
    return ids


async def create(server: LiveServer, history: list[dict[str, Any]]) -> dict[str, Any]:
    body = {"model": "model-a", "input": history, "store": False,
            "include": ["output[*].token_ids"]}  # fmt: skip
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{server.base_url}/responses", json=body) as resp,
    ):
        answer: dict[str, Any] = await resp.json()
        assert resp.status == 200, answer
        return answer


async def test_a_noncanonical_split_is_carried_exactly(
    engine_for: StartEngine, token_peer: TokenPeer, tokenizer_dir: Path
) -> None:
    """TOK-62: turn 1 samples ``TEXT`` with ``Paris`` split in two; its item carries those ids
    (TOK-60). Two stateless resends carrying the fields back: the peer's turn 2 prompt holds
    the split ids exactly where turn 1's answer was, turn 3's prompt extends turn 2's (whose
    carried prompt holds the split and is accepted, TOK-63), and the route continued from
    carried ids both times."""
    split = split_ids(token_peer.tokenizer)
    token_peer.script.append(split)
    server = await engine_for(tokens_router(token_peer, tokenizer_dir, "vllm"))
    history: list[dict[str, Any]] = [{"role": "user", "content": "Weather?"}]
    for n in range(3):
        answer = await create(server, history)
        (item,) = answer["output"]
        assert item["prompt_token_ids"] == token_peer.turns[n].prompt
        assert item["generation_token_ids"] == token_peer.turns[n].answer
        if n == 0:
            assert item["content"][0]["text"] == TEXT
            assert item["generation_token_ids"] == [*split, token_peer.end_id]
        history += [item, {"role": "user", "content": "Thanks"}]
    first = token_peer.turns[0]
    head = first.prompt + first.answer
    assert token_peer.turns[1].prompt[: len(head)] == head  # the split, id for id
    assert_exact(token_peer)  # every later prompt = the previous prompt + its answer + new ids
    assert backend_of(server).stats["render.carried"] == 2
