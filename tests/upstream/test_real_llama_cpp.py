"""Opt-in end to end against a real inference server (``make test-real``): llama-cpp-python's
OpenAI-compatible server on the CPU with a tiny GGUF the test writes itself, fronted by our
server and driven by the official openai SDK over WebSocket; and a token-in rollout through a
``tokens`` route against llama.cpp's ``/completion`` shape on the same library
(``llama_token_server.py``).

Skipped unless ``ROLLOUT_REAL_PYTHON`` names an interpreter with ``llama-cpp-python[server]``
and ``gguf`` installed (PyPI ships llama-cpp-python as source only: building it takes about
27 minutes on 2 cores, which is why this is not part of ``make test``).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI
from tokenizers import Tokenizer

from clients.bench.tiny_model import make_tokenizer
from engine.models.config import build_router, parse_config
from tests.support.server import LiveServer
from tests.support.tools import WEATHER
from tests.support.wait import wait_for
from tests.upstream.conftest import StartEngine

REAL_PYTHON = os.environ.get("ROLLOUT_REAL_PYTHON", "")
pytestmark = [
    pytest.mark.skipif(not REAL_PYTHON, reason="set ROLLOUT_REAL_PYTHON (see make test-real)"),
    pytest.mark.timeout(300),
]
HERE = Path(__file__).parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _run(*args: str) -> None:
    proc = await asyncio.create_subprocess_exec(*args)
    assert await proc.wait() == 0, args


async def _ready(url: str, deadline_s: float = 120) -> None:
    async with aiohttp.ClientSession() as http:

        async def answers() -> bool:
            try:
                async with http.get(url) as resp:
                    return resp.status == 200
            except aiohttp.ClientError:
                return False

        await wait_for(answers, f"llama.cpp server ready at {url}", limit=deadline_s)


@pytest.fixture
async def llama_url(tmp_path: Path) -> AsyncIterator[str]:
    model = tmp_path / "tiny.gguf"
    await _run(REAL_PYTHON, str(HERE / "make_tiny_gguf.py"), str(model))
    port = _free_port()
    server = await asyncio.create_subprocess_exec(
        REAL_PYTHON, "-m", "llama_cpp.server", "--model", str(model),
        "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "2048",
        "--chat_format", "chatml-function-calling",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        await _ready(f"http://127.0.0.1:{port}/v1/models")
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.terminate()
        await server.wait()


@pytest.fixture
async def real_server(llama_url: str, engine_for: StartEngine) -> LiveServer:
    route = {"backend": "chat", "base_url": llama_url, "model": "tiny", "read_timeout": 60}
    router = build_router(parse_config({"default": "tiny", "models": {"tiny": route}}))
    return await engine_for(router, default_model="tiny")


async def test_text_and_forced_tool_call_round_trip(real_server: LiveServer) -> None:
    client = AsyncOpenAI(base_url=real_server.base_url, api_key="unused")
    try:
        async with client.responses.connect() as conn:
            await conn.response.create(model="tiny", input="hello", max_output_tokens=8)
            text = await _terminal(conn)
            assert text.status in ("completed", "incomplete")
            assert text.usage.input_tokens > 0 and 0 < text.usage.output_tokens <= 8
            await conn.response.create(
                model="tiny",
                input="Weather in Paris?",
                tools=[WEATHER],
                tool_choice={"type": "function", "name": "get_weather"},
                max_output_tokens=64,
            )
            called = await _terminal(conn)
            call = called.output[-1]
            assert call.type == "function_call" and call.name == "get_weather"
            # random weights may put control characters inside the string: parse leniently
            assert isinstance(json.loads(call.arguments, strict=False)["city"], str)
            await conn.response.create(
                model="tiny",
                previous_response_id=called.id,
                input=[{"type": "function_call_output", "call_id": call.call_id, "output": "ok"}],
                tools=[WEATHER],
                tool_choice="none",
                max_output_tokens=8,
            )
            answer = await _terminal(conn)
            assert answer.status in ("completed", "incomplete")
    finally:
        await client.close()
    assert real_server.engine.counters["create.fast_path"] == 1


async def _terminal(conn: Any) -> Any:
    async for event in conn:
        if event.type in ("response.completed", "response.incomplete"):
            return event.response
        assert event.type not in ("error", "response.failed"), event
    raise AssertionError("connection closed")


# ----------------------------------------------------------------------------- token-in (TOK-2)


@pytest.fixture
async def llama_tokens_url(tmp_path: Path) -> AsyncIterator[tuple[str, Path]]:
    """llama.cpp's ``/completion`` over real llama.cpp inference (``llama_token_server.py``),
    on a GGUF whose vocabulary has the size of a tokenizer the test trains: the engine renders
    with that tokenizer, llama.cpp samples ids it decodes."""
    tokenizer = make_tokenizer(tmp_path / "tokenizer")
    size = Tokenizer.from_file(str(tokenizer / "tokenizer.json")).get_vocab_size()
    model = tmp_path / "tiny.gguf"
    await _run(REAL_PYTHON, str(HERE / "make_tiny_gguf.py"), str(model), str(size))
    server = await asyncio.create_subprocess_exec(
        REAL_PYTHON, str(HERE / "llama_token_server.py"), str(model),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        line = await asyncio.wait_for(server.stdout.readline(), 120)
        assert line.startswith(b"PORT "), line
        yield f"http://127.0.0.1:{int(line.split()[1])}", tokenizer
    finally:
        server.terminate()
        await server.wait()


async def test_token_in_rollout_against_llama_cpp(
    llama_tokens_url: tuple[str, Path], engine_for: StartEngine
) -> None:
    """A token-array prompt in, sampled ids and their logprobs out; the second turn's prompt is
    the first prompt plus the ids llama.cpp sampled, exactly (TOK-4); usage is its count."""
    url, tokenizer = llama_tokens_url
    route = {
        "backend": "tokens",
        "api": "llamacpp",
        "base_url": url,
        "model": "tiny",
        "tokenizer": str(tokenizer),
        "read_timeout": 60,
    }
    router = build_router(parse_config({"default": "tiny", "models": {"tiny": route}}))
    server = await engine_for(router, default_model="tiny")
    client = AsyncOpenAI(base_url=server.base_url, api_key="unused")
    include = ["rollout.token_ids"]
    try:
        async with client.responses.connect() as conn:
            await conn.response.create(
                model="tiny", input="hello", max_output_tokens=8, include=include
            )
            first = await _terminal(conn)
            await conn.response.create(
                model="tiny",
                input="again",
                previous_response_id=first.id,
                max_output_tokens=8,
                include=include,
            )
            second = await _terminal(conn)
    finally:
        await client.close()
    async with aiohttp.ClientSession() as http, http.get(f"{url}/turns") as resp:
        turns = await resp.json()
    assert len(turns) == 2
    head = turns[0]["prompt"] + turns[0]["answer"]
    assert turns[1]["prompt"][: len(head)] == head
    (step,) = first.model_extra["rollout_tokens"]["samples"]
    assert step["token_ids"] == turns[0]["answer"]
    assert all(isinstance(lp, float) and lp <= 0 for lp in step["logprobs"])
    assert second.usage.input_tokens == len(turns[1]["prompt"])
