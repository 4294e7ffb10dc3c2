"""For any history, a stateless resend = the ``previous_response_id`` continuation, token for
token (COMPAT-7, COMPAT-8; issue 47's property).

A ``tokens`` route in front of the token peer (``tests/upstream/token_peer.py``: it samples ids
a re-render would never produce, TOK-42, so a prompt rendered afresh differs from one that
continues). For a generated conversation (1 to 3 user texts of any unicode, tools declared or
not, instructions or not, generated tool outputs) it runs twice:

(a) over a WebSocket, ``store: false``, each turn naming the previous response
    (``previous_response_id``: the rollout resumes, COMPAT-2);
(b) over HTTP, ``store: false``, nothing named: the whole history resent each turn, the output
    items sent back in a generated SDK shape (as received; ids and status dropped; ``None``
    fields dropped; an answer as a plain string: COMPAT-8).

Every prompt the peer received in (b) is, id for id, the prompt it received in the same turn of
(a), and every turn of (b) after the first continued a context (``create.resent``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core import EngineConfig
from tests.fuzz._support import LiveEnv, LoopThread, WsConn, examples, timeout_for
from tests.upstream.reasoning_peer import QWEN3_TEMPLATE
from tests.upstream.token_peer import TokenPeer, make_tokenizer, tokens_router

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
MAX_TURNS = 8
# Text a client may write: any unicode but the template's own markers (a user typing
# ``<|im_start|>`` is another matter: the template, not the resend, decides what it reads).
texts = st.text(st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]), min_size=1).filter(
    lambda t: "<" not in t and t.strip() == t and t
)
Shape = Callable[[dict[str, Any]], dict[str, Any]]


def _received(item: dict[str, Any]) -> dict[str, Any]:
    return item


def _no_ids(item: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in item.items() if k not in ("id", "status")}


def _no_nones(item: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in item.items() if v is not None}


def _as_string(item: dict[str, Any]) -> dict[str, Any]:
    if item["type"] == "message":
        return {"role": item["role"], "content": item["content"][0]["text"]}
    return item


@dataclass
class Conversation:
    users: list[str]
    outputs: list[str]
    tools: bool
    instructions: str | None
    shape: Shape

    def body(self, items: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"model": "model-a", "input": items, "store": False, **extra}
        if self.tools:
            body["tools"] = [WEATHER]
        if self.instructions is not None:
            body["instructions"] = self.instructions
        return body

    def next_items(self, output: list[dict[str, Any]], turn: int) -> list[dict[str, Any]] | None:
        """What the client sends after ``output``: the tool's answer, the next user text, or
        None when the conversation is over."""
        calls = [item for item in output if item["type"] == "function_call"]
        if calls:
            text = self.outputs[turn % len(self.outputs)]
            return [
                {"type": "function_call_output", "call_id": c["call_id"], "output": text}
                for c in calls
            ]
        self.asked += 1
        if self.asked >= len(self.users):
            return None
        return [{"role": "user", "content": self.users[self.asked]}]

    asked: int = 0


@st.composite
def conversations(draw: st.DrawFn) -> Conversation:
    return Conversation(
        users=draw(st.lists(texts, min_size=1, max_size=3)),
        outputs=draw(st.lists(texts, min_size=1, max_size=3)),
        tools=draw(st.booleans()),
        instructions=draw(st.none() | texts),
        shape=draw(st.sampled_from([_received, _no_ids, _no_nones, _as_string])),
    )


async def by_previous_id(env: LiveEnv, conv: Conversation) -> int:
    """(a): WebSocket, ``previous_response_id`` each turn. Returns the number of turns."""
    conn = await WsConn.open(env)
    items: list[dict[str, Any]] | None = [{"role": "user", "content": conv.users[0]}]
    prev: str | None = None
    conv.asked = 0
    try:
        for turn in range(MAX_TURNS):
            assert items is not None
            extra: dict[str, Any] = {"type": "response.create"}
            if prev is not None:
                extra["previous_response_id"] = prev
            await conn.send(conv.body(items, **extra))
            while True:
                event = await conn.recv()
                assert event["type"] not in ("error", "response.failed"), event
                if event["type"] == "response.completed":
                    break
            response = event["response"]
            prev = response["id"]
            items = conv.next_items(response["output"], turn)
            if items is None:
                return turn + 1
        raise AssertionError("the conversation did not end")
    finally:
        await conn.close()


async def by_resend(env: LiveEnv, conv: Conversation) -> int:
    """(b): HTTP, the whole history each turn, the output in ``conv.shape``."""
    history: list[dict[str, Any]] = [{"role": "user", "content": conv.users[0]}]
    conv.asked = 0
    url = f"{env.live.base_url}/responses"
    for turn in range(MAX_TURNS):
        async with env.client.post(url, json=conv.body(history)) as reply:
            response = await reply.json()
            assert reply.status == 200, response
        history += [conv.shape(item) for item in response["output"]]
        items = conv.next_items(response["output"], turn)
        if items is None:
            return turn + 1
        history += items
    raise AssertionError("the conversation did not end")


@pytest.fixture(scope="module")
def peer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TokenPeer, Path]]:
    directory = make_tokenizer(tmp_path_factory.mktemp("qwen3"), QWEN3_TEMPLATE)
    thread = LoopThread()
    token_peer = TokenPeer(directory)
    thread.run(token_peer.start())
    try:
        yield token_peer, directory
    finally:
        thread.run(token_peer.stop())
        thread.close()


@pytest.fixture(scope="module")
def env(peer: tuple[TokenPeer, Path]) -> Iterator[LiveEnv]:
    token_peer, directory = peer
    config = EngineConfig(tokens_per_second=0, default_model="model-a")
    live = LiveEnv(config, tokens_router(token_peer, directory, "vllm"))
    try:
        yield live
    finally:
        live.close()


@pytest.mark.timeout(timeout_for(180))
@settings(
    max_examples=examples(ci=0.25, deep=0.02),
    suppress_health_check=[HealthCheck.function_scoped_fixture],
    deadline=None,
)
@given(conv=conversations())
def test_a_resend_is_the_previous_id_continuation_token_for_token(
    env: LiveEnv, peer: tuple[TokenPeer, Path], conv: Conversation
) -> None:
    """COMPAT-7, COMPAT-8: (b)'s prompts are (a)'s, id for id, and (b) continued each turn."""
    token_peer, _ = peer
    counters = env.live.engine.counters
    start = len(token_peer.turns)
    turns = env.run(by_previous_id(env, conv))
    middle = len(token_peer.turns)
    resent = counters["create.resent"]
    assert env.run(by_resend(env, conv)) == turns
    chained = [turn.prompt for turn in token_peer.turns[start:middle]]
    resends = [turn.prompt for turn in token_peer.turns[middle:]]
    assert resends == chained, json.dumps([conv.users, conv.tools, conv.shape.__name__])
    assert counters["create.resent"] - resent == turns - 1
