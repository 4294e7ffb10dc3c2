"""Fixtures: local upstream peers, and our server routed to them.

``engine_for`` builds ``Engine(EngineConfig(...), router=...)`` itself (the shared
``start_server`` always uses the simulator) and cleans everything up, which also closes the
shared upstream HTTP pool through ``Engine.stop``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from engine.core import EngineConfig
from engine.models.config import build_router, parse_config
from engine.models.router import Router
from tests.support.fixtures import started
from tests.support.server import LiveServer, start_server
from tests.upstream.peer import SECRET, ChatPeer, ResponsesPeer
from tests.upstream.reasoning_peer import QWEN3_TEMPLATE, HarmonyPeer
from tests.upstream.token_peer import TokenPeer, make_tokenizer

KEY_ENV = "ROLLOUT_TEST_UPSTREAM_KEY"
StartEngine = Callable[..., Awaitable[LiveServer]]


@pytest.fixture(autouse=True)
def upstream_key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(KEY_ENV, SECRET)
    return SECRET


@pytest.fixture
async def chat_peer() -> AsyncIterator[ChatPeer]:
    async with started(ChatPeer()) as peer:
        yield peer


@pytest.fixture
async def responses_peer() -> AsyncIterator[ResponsesPeer]:
    async with started(ResponsesPeer()) as peer:
        yield peer


def route(backend: str, base_url: str, **extra: Any) -> dict[str, Any]:
    return {
        "backend": backend,
        "base_url": base_url,
        "model": "up-model",
        "api_key_env": KEY_ENV,
        "aliases": ["gpt-up"],
        **extra,
    }


def router_for(backend: str, base_url: str, **extra: Any) -> Router:
    """``model-a`` (alias ``gpt-up``) -> the peer, also the default; ``sim`` stays routable."""
    raw = {
        "default": "model-a",
        "models": {"model-a": route(backend, base_url, **extra), "sim": {"backend": "sim"}},
    }
    return build_router(parse_config(raw))


def engine_config(**config: Any) -> EngineConfig:
    """An instant engine whose default model is ``model-a``, with ``config`` over that."""
    return EngineConfig(**{"tokens_per_second": 0, "default_model": "model-a", **config})


async def start_engine(router: Router, **config: Any) -> LiveServer:
    return await start_server(engine_config(**config), router)


@pytest.fixture
def engine_for(server_factory: Callable[..., Awaitable[LiveServer]]) -> StartEngine:
    """Engines before ``router``'s upstreams, each with ``start_engine``'s settings; all are
    cleaned up after the test (``server_factory``)."""

    async def make(router: Router, **config: Any) -> LiveServer:
        return await server_factory(engine_config(**config), router)

    return make


@pytest.fixture
async def chat_server(chat_peer: ChatPeer, engine_for: StartEngine) -> LiveServer:
    return await engine_for(router_for("chat", chat_peer.base_url))


@pytest.fixture
async def responses_server(responses_peer: ResponsesPeer, engine_for: StartEngine) -> LiveServer:
    return await engine_for(router_for("responses", responses_peer.base_url))


# The tokens backend's peer (TOK-1..TOK-9): a tokenizer trained once per module, a peer per test.
@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture
async def token_peer(tokenizer_dir: Path) -> AsyncIterator[TokenPeer]:
    async with started(TokenPeer(tokenizer_dir)) as peer:
        yield peer


# A model whose template thinks (Qwen3's) and a harmony model on the same vocabulary (TOK-1,
# HARMONY-1, SEAL-*, TOK-60): the tokenizer trained once per module, a peer per test.
@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tokenizer(tmp_path_factory.mktemp("qwen3"), QWEN3_TEMPLATE)


@pytest.fixture
async def think_peer(qwen3_dir: Path) -> AsyncIterator[TokenPeer]:
    async with started(TokenPeer(qwen3_dir)) as peer:
        yield peer


@pytest.fixture
async def harmony_peer(qwen3_dir: Path) -> AsyncIterator[HarmonyPeer]:
    async with started(HarmonyPeer(qwen3_dir)) as peer:
        yield peer
