"""Real clients through a ``tokens`` route (TOK-1, TOK-7): the Agents SDK over WebSocket and
HTTP, and the pinned Codex CLI over WebSocket and HTTP, each running a tool chain against the
token peer. Where the client continues by ``previous_response_id`` the peer sees every prompt
extend the last exactly; a client that resends the whole history (stateless) gets a fresh
render of it, which still works."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import agents
import pytest
from agents import Agent, Runner, function_tool, responses_websocket_session
from agents.models.openai_responses import OpenAIResponsesModel
from openai import AsyncOpenAI

from tests.conformance.codex import MARKER, assert_no_error, run_codex
from tests.support.server import LiveServer
from tests.upstream.conftest import StartEngine
from tests.upstream.token_peer import (
    TokenPeer,
    assert_exact,
    backend_of,
    tokens_router,
)

agents.set_tracing_disabled(True)  # no exporter may try the network


@pytest.fixture
async def tokens_server(
    token_peer: TokenPeer, tokenizer_dir: Path, engine_for: StartEngine
) -> LiveServer:
    return await engine_for(tokens_router(token_peer, tokenizer_dir, "vllm"))


def weather_agent(calls: list[str], model: Any = "model-a") -> Agent[Any]:
    @function_tool
    def get_weather(city: str) -> str:
        """Current weather for a city.

        Args:
            city: The city name.
        """
        calls.append(city)
        return f"sunny in {city}"

    return Agent(name="weather", instructions="Use the tool.", tools=[get_weather], model=model)


async def test_agents_ws_chained_run_is_token_exact(
    tokens_server: LiveServer, token_peer: TokenPeer
) -> None:
    calls: list[str] = []
    async with responses_websocket_session(base_url=tokens_server.base_url, api_key="x") as ws:
        result = await ws.run(weather_agent(calls), "Weather?", auto_previous_response_id=True)
    assert calls == ["Paris"]
    assert result.final_output == "Tool said: sunny in Paris"
    assert tokens_server.engine.counters["create.fast_path"] == 1
    assert_exact(token_peer)
    assert backend_of(tokens_server).stats["render.full"] == 1


async def test_agents_ws_replayed_history_still_works(
    tokens_server: LiveServer, token_peer: TokenPeer
) -> None:
    """COMPAT-7: the SDK's default resends the whole history with no previous_response_id;
    the second create continues the first's trajectory (rendered once), token-exact."""
    calls: list[str] = []
    async with responses_websocket_session(base_url=tokens_server.base_url, api_key="x") as ws:
        result = await ws.run(weather_agent(calls), "Weather?")
    assert result.final_output == "Tool said: sunny in Paris"
    assert backend_of(tokens_server).stats["render.full"] == 1
    assert tokens_server.engine.counters["create.resent"] == 1
    assert_exact(token_peer)


async def test_agents_http_chained_run_is_token_exact(
    tokens_server: LiveServer, token_peer: TokenPeer
) -> None:
    client = AsyncOpenAI(base_url=tokens_server.base_url, api_key="x", max_retries=0)
    calls: list[str] = []
    try:
        model = OpenAIResponsesModel(model="model-a", openai_client=client)
        result = await Runner.run(
            weather_agent(calls, model), "Weather?", auto_previous_response_id=True
        )
    finally:
        await client.close()
    assert result.final_output == "Tool said: sunny in Paris"
    assert_exact(token_peer)


def _codex_script(peer: TokenPeer) -> None:
    call = {"name": "exec_command", "arguments": {"cmd": "ls"}}
    peer.script.append(f"<tool_call>\n{json.dumps(call)}\n</tool_call>")


@pytest.mark.timeout(240)
async def test_codex_over_websocket_through_tokens(
    tokens_server: LiveServer,
    token_peer: TokenPeer,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.INFO)
    _codex_script(token_peer)
    run = await run_codex(tokens_server, tmp_path, monkeypatch, websockets=True)
    assert_no_error(run, caplog)
    assert MARKER in run.answer, run.answer  # exec_command ran `ls`, the model read it
    assert run.counters["create.fast_path"] >= 1
    assert len(token_peer.turns) == 2
    assert_exact(token_peer)


@pytest.mark.timeout(240)
async def test_codex_over_http_through_tokens(
    tokens_server: LiveServer,
    token_peer: TokenPeer,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.INFO)
    _codex_script(token_peer)
    run = await run_codex(tokens_server, tmp_path, monkeypatch, websockets=False)
    assert_no_error(run, caplog)
    assert MARKER in run.answer, run.answer
    assert len(token_peer.turns) == 2
