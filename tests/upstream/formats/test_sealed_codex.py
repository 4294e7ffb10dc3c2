"""The Codex CLI over HTTP (``store: false``, the whole input every turn) in front of a
``tokens`` route with the ``think`` reasoning parser, and one with harmony (SEAL-1, SEAL-4,
CODEX-3): Codex asks for
``reasoning.encrypted_content`` itself, keeps the sealed reasoning item, sends it back with
the tool output, and the second prompt the token peer reads is the first prompt plus the ids
it sampled, exactly (TOK-42's peer), with no store in between."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from engine.core import EngineConfig
from engine.models.config import build_router, parse_config
from tests.conformance.codex import CATALOG_ENTRY, MARKER, CodexTask, assert_no_error, run_codex
from tests.support.fixtures import started
from tests.support.server import LiveServer, start_server
from tests.upstream.reasoning_peer import HarmonyPeer
from tests.upstream.token_peer import TokenPeer, assert_exact

CALL = json.dumps({"name": "exec_command", "arguments": {"cmd": "ls"}})
SCRIPTS = {
    "think": [
        f"<think>\nList the files first.\n</think>\n\n<tool_call>\n{CALL}\n</tool_call>",
        "<think>\nThe listing came back.\n</think>\n\nDone: I listed the files.",
    ],
    "harmony": [
        "<|channel|>analysis<|message|>List the files first.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.exec_command <|constrain|>json"
        '<|message|>{"cmd": "ls"}<|call|>',
        "<|channel|>analysis<|message|>The listing came back.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Done: I listed the files.<|return|>",
    ],
}


@pytest.fixture(params=["think", "harmony"])
def reader(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def peer(qwen3_dir: Path, reader: str) -> AsyncIterator[TokenPeer]:
    async with started(
        HarmonyPeer(qwen3_dir) if reader == "harmony" else TokenPeer(qwen3_dir)
    ) as peer:
        yield peer


@pytest.fixture
async def sealed_server(
    peer: TokenPeer, qwen3_dir: Path, reader: str, tmp_path: Path
) -> AsyncIterator[LiveServer]:
    """``sim`` (the model Codex asks for) is a ``tokens`` route with the think parser, or
    gpt-oss harmony."""
    keys = tmp_path / "reasoning-keys"
    keys.write_text(bytes(range(32)).hex() + "\n")
    route: dict[str, Any] = {"backend": "tokens", "api": "vllm", "base_url": peer.base_url}
    if reader == "harmony":
        route |= {"model": "gpt-oss-tiny", "template": "harmony"}
    else:
        route |= {"model": "tiny", "tokenizer": str(qwen3_dir), "reasoning_parser": "think"}
    router = build_router(parse_config({"default": "sim", "models": {"sim": route}}))
    config = EngineConfig(tokens_per_second=0, default_model="sim", reasoning_key_file=keys)
    server = await start_server(config, router)
    try:
        yield server
    finally:
        await server.runner.cleanup()


def reasoning_catalog(home: Path) -> str:
    """A model catalog in which ``sim`` reasons, so Codex sends ``reasoning`` and asks for
    ``reasoning.encrypted_content``."""
    entry: dict[str, Any] = {
        **CATALOG_ENTRY,
        "supports_reasoning_summaries": True,
        "default_reasoning_level": "medium",
        "supported_reasoning_levels": [{"effort": "medium", "description": "medium"}],
        "reasoning_summary_format": "none",
    }
    home.mkdir(parents=True, exist_ok=True)
    path = home / "reasoning-models.json"
    path.write_text(json.dumps({"models": [entry]}))
    return f'model_catalog_json = "{path}"\n'


@pytest.mark.timeout(240)
async def test_codex_over_http_continues_sealed_reasoning_exactly(
    sealed_server: LiveServer,
    peer: TokenPeer,
    reader: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.INFO)
    peer.script.extend(SCRIPTS[reader])
    task = CodexTask("List the files.", settings=reasoning_catalog(tmp_path / "catalog"))
    run = await run_codex(sealed_server, tmp_path, monkeypatch, websockets=False, task=task)
    assert_no_error(run, caplog)
    assert "Done: I listed the files." in run.answer
    first, second = run.requests
    assert first["include"] == ["reasoning.encrypted_content"] and first["store"] is False
    assert "previous_response_id" not in second
    sent = [i for i in second["input"] if i["type"] == "reasoning"]
    assert len(sent) == 1 and sent[0]["encrypted_content"].startswith("rseal1.")
    assert sealed_server.engine.counters["create.stateless"] == 2
    assert len(peer.turns) == 2
    assert_exact(peer)  # the second prompt: the first, its sampled ids, the tool output
    assert MARKER in peer.text(peer.turns[1].prompt)
