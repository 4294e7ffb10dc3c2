"""End to end against the real llama.cpp server (``make test-real``, part of ``make test``;
TOK-40, TOK-41): ``llama-server`` built from the llama.cpp source that the llama-cpp-python
sdist vendors, on a tiny random-weight GGUF whose vocabulary *is* the tokenizer the test trains
(``tests/support/tiny_gguf.py``), so the server and the engine share ids. Driven by the openai
SDK over WebSocket and HTTP:

* a ``chat`` route through its ``/v1/chat/completions`` (``--jinja``: the GGUF's template);
* a ``tokens`` route through its ``/completion`` (token-array ``prompt``, ``return_tokens``,
  ``n_probs``). A recording pass-through between the engine and llama-server keeps every prompt
  sent and every id llama.cpp streamed back: each continuation's prompt is the previous prompt
  plus the ids llama.cpp sampled, exactly, including after a turn cut off by
  ``max_output_tokens``;
* the same ``tokens`` route, stateless: a resend carrying the previous turns' training fields
  (TOK-62) continues from them, the prompt llama.cpp reads beginning with the previous prompt
  and the ids it sampled.

Needs ``ROLLOUT_LLAMA_SERVER``, the binary (``make test-real`` builds it and sets it); without
it the tests fail saying so. ``make unit`` leaves this module to ``make test-real``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from openai import AsyncOpenAI

from clients.bench.services.tiny_model import make_tokenizer
from engine.models.config import build_router, parse_config
from tests.support.server import LiveServer, free_port, serve_app
from tests.support.tiny_gguf import write as write_gguf
from tests.support.wait import wait_healthy
from tests.upstream.conftest import StartEngine

LLAMA_SERVER = os.environ.get("ROLLOUT_LLAMA_SERVER", "")
pytestmark = pytest.mark.timeout(300)
INCLUDE = ["rollout.token_ids"]


@dataclass
class Llama:
    url: str  # the server root
    tokenizer: Path


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Llama]:
    """One llama-server for the module: one slot (its prompt cache follows one chain at a
    time), greedy, the GGUF's own chat template (``--jinja``)."""
    assert LLAMA_SERVER, "set ROLLOUT_LLAMA_SERVER to llama-server (make test-real builds it)"
    root = tmp_path_factory.mktemp("llama")
    tokenizer = make_tokenizer(root / "tokenizer")
    model = write_gguf(root / "tiny.gguf", tokenizer)
    port = free_port()
    log = (root / "llama-server.log").open("wb")
    args = [LLAMA_SERVER, "-m", str(model), "--host", "127.0.0.1", "--port", str(port)]
    args += ["--jinja", "-c", "4096", "-np", "1", "-t", "2", "--temp", "0", "--seed", "0"]
    server = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        asyncio.run(wait_healthy(f"{url}/health", f"llama-server ready at {url}", limit=120))
        yield Llama(url, tokenizer)
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


# ----------------------------------------------------------------------------- the recorder


@dataclass
class Turn:
    prompt: list[int]
    answer: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    last: dict[str, Any] = field(default_factory=dict)  # llama.cpp's `stop: true` chunk


class Recorder:
    """Passes ``POST /completion`` through to llama-server unchanged, keeping the prompt and
    the ids (and logprobs) it answered, whole (the default, TOK-44) or streamed: what llama.cpp
    itself read and sampled."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.turns: list[Turn] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self, http: aiohttp.ClientSession) -> None:
        self._http = http
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/completion", self._completion)
        self.runner, port = await serve_app(app)
        self.url = f"http://127.0.0.1:{port}"

    async def _completion(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        turn = Turn(prompt=list(json.loads(raw)["prompt"]))
        self.turns.append(turn)
        headers = {"Content-Type": "application/json"}
        async with self._http.post(f"{self.upstream}/completion", data=raw, headers=headers) as up:
            resp = web.StreamResponse(status=up.status, headers={"Content-Type": up.content_type})
            await resp.prepare(request)
            if up.content_type == "application/json":  # the whole answer (TOK-44)
                whole = await up.read()
                self._note(turn, json.loads(whole))
                await resp.write(whole)
            else:
                async for line in up.content:
                    if line.startswith(b"data: "):
                        self._note(turn, json.loads(line[len(b"data: ") :]))
                    await resp.write(line)
            await resp.write_eof()
            return resp

    @staticmethod
    def _note(turn: Turn, chunk: dict[str, Any]) -> None:
        turn.answer += chunk.get("tokens", [])
        turn.logprobs += [p["logprob"] for p in chunk.get("completion_probabilities", [])]
        if chunk.get("stop"):
            turn.last = chunk


@pytest.fixture
async def recorder(llama: Llama) -> AsyncIterator[Recorder]:
    async with aiohttp.ClientSession() as http:
        recorder = Recorder(llama.url)
        await recorder.start(http)
        try:
            yield recorder
        finally:
            assert recorder.runner is not None
            await recorder.runner.cleanup()


def _router(**route: Any) -> Any:
    return build_router(parse_config({"default": "tiny", "models": {"tiny": route}}))


async def _terminal(conn: Any) -> Any:
    async for event in conn:
        if event.type in ("response.completed", "response.incomplete"):
            return event.response
        assert event.type not in ("error", "response.failed"), event
    raise AssertionError("connection closed")


# ----------------------------------------------------------------------------- tokens route


def assert_chain_exact(turns: list[Turn], responses: list[Any]) -> None:
    """Each prompt llama.cpp read is the previous prompt plus the ids llama.cpp sampled, then
    new ids (TOK-4); what the engine reports is what llama.cpp streamed (TOK-9)."""
    assert len(turns) == len(responses) >= 2
    for before, after in itertools.pairwise(turns):
        head = before.prompt + before.answer
        assert len(after.prompt) > len(head)
        assert after.prompt[: len(head)] == head
    for turn, response in zip(turns, responses, strict=True):
        (sample,) = response.model_extra["rollout_tokens"]["samples"]
        assert sample["token_ids"] == turn.answer and turn.answer
        # llama.cpp keeps no probability for a token that ends inside a UTF-8 character: the
        # engine reports None there and llama.cpp's own figures, in order, everywhere else.
        reported = sample["logprobs"]
        assert len(reported) == len(turn.answer)
        assert [lp for lp in reported if lp is not None] == pytest.approx(turn.logprobs)
        assert all(lp <= 0 for lp in turn.logprobs)
        assert response.usage.input_tokens == len(turn.prompt) == turn.last["tokens_evaluated"]
        assert response.usage.output_tokens == turn.last["tokens_predicted"]


async def test_tokens_route_continuations_exact_ws_and_http(
    llama: Llama, recorder: Recorder, engine_for: StartEngine
) -> None:
    """Three turns over WebSocket (each cut off by ``max_output_tokens``: a truncated turn's
    ids are kept and continued exactly), then two over HTTP through the store, and the
    stored trajectory equals what llama.cpp read and sampled."""
    route = {"backend": "tokens", "api": "llamacpp", "base_url": recorder.url, "model": "tiny"}
    router = _router(**route, tokenizer=str(llama.tokenizer), read_timeout=60)
    server = await engine_for(router, default_model="tiny", park_seconds=0, hydration_cache_bytes=0)
    client = AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    ws: list[Any] = []
    try:
        async with client.responses.connect() as conn:
            for text in ("hello", "again", "and once more"):
                previous = {"previous_response_id": ws[-1].id} if ws else {}
                await conn.response.create(
                    model="tiny", input=text, max_output_tokens=6, include=INCLUDE, **previous
                )
                ws.append(await _terminal(conn))
        assert_chain_exact(recorder.turns, ws)
        # every turn was cut at its 6 tokens, and the next continued from the cut (TOK-8)
        cut = [(r.status, r.incomplete_details and r.incomplete_details.reason) for r in ws]
        assert cut == [("incomplete", "max_output_tokens")] * 3, cut
        assert [len(turn.answer) for turn in recorder.turns] == [6] * 3
        assert server.engine.counters["create.cache_hit"] == 2
        # llama.cpp's own prompt cache agreed: the prefix it had was reused, not re-read
        assert recorder.turns[2].last["timings"]["cache_n"] >= len(recorder.turns[1].prompt)
        start = len(recorder.turns)
        first = await client.responses.create(
            model="tiny", input="weather?", max_output_tokens=6, include=INCLUDE
        )
        second = await client.responses.create(
            model="tiny",
            input="thanks",
            previous_response_id=first.id,
            max_output_tokens=6,
            include=INCLUDE,
        )
        assert_chain_exact(recorder.turns[start:], [first, second])
        stored = await _stored_tokens(server, second.id)
    finally:
        await client.close()
    last = recorder.turns[-1]
    assert stored["token_ids"] == last.prompt + last.answer
    assert stored["sampled"].count(True) == len(recorder.turns[start].answer) + len(last.answer)


async def _stored_tokens(server: LiveServer, response_id: str) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{server.base_url}/responses/{response_id}/tokens") as resp,
    ):
        assert resp.status == 200, await resp.text()
        body: dict[str, Any] = await resp.json()
        return body


# ----------------------------------------------------------------------------- chat route


async def test_chat_route_ws_and_http_and_the_same_prompt(
    llama: Llama, recorder: Recorder, engine_for: StartEngine
) -> None:
    """The ``chat`` route through llama-server's ``/v1/chat/completions`` with its ``--jinja``
    template: a text turn and its continuation over WebSocket (the connection cache), a
    continuation over HTTP; and llama.cpp's prompt for a first turn has exactly the
    length the engine's ``tokens`` renderer gives the same input (one template, one vocabulary).
    """
    chat = {"backend": "chat", "base_url": f"{llama.url}/v1", "model": "tiny", "read_timeout": 60}
    tokens = {"backend": "tokens", "api": "llamacpp", "base_url": recorder.url, "model": "tiny"}
    raw = {"tiny": chat, "tiny-tokens": {**tokens, "tokenizer": str(llama.tokenizer)}}
    server = await engine_for(build_router(parse_config({"default": "tiny", "models": raw})))
    client = AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    try:
        async with client.responses.connect() as conn:
            await conn.response.create(model="tiny", input="hello", max_output_tokens=8)
            text = await _terminal(conn)
            assert text.usage.input_tokens > 0 and 0 < text.usage.output_tokens <= 8
            await conn.response.create(
                model="tiny", input="more", previous_response_id=text.id, max_output_tokens=8
            )
            more = await _terminal(conn)
            assert more.status in ("completed", "incomplete") and more.usage.output_tokens > 0
            # the history went to llama.cpp whole and it rendered it with the GGUF's template
            assert more.usage.input_tokens > text.usage.input_tokens + text.usage.output_tokens
        assert server.engine.counters["create.cache_hit"] == 1
        follow = await client.responses.create(
            model="tiny", input="and now?", previous_response_id=text.id, max_output_tokens=4
        )
        assert follow.status in ("completed", "incomplete") and follow.usage.output_tokens > 0
        same = await client.responses.create(
            model="tiny-tokens", input="hello", max_output_tokens=1
        )
    finally:
        await client.close()
    assert recorder.turns[-1].prompt and same.usage.input_tokens == text.usage.input_tokens


# ----------------------------------------------------------------------------- carried ids


async def test_a_stateless_resend_carrying_ids_continues_exactly(
    llama: Llama, recorder: Recorder, engine_for: StartEngine
) -> None:
    """TOK-62 against the real llama-server (TOK-40): three stateless creates (``store:
    false``, no ``previous_response_id``), each resending the whole history with the training
    fields its items came back with (TOK-60, asked by ``include``). Each item carries the prompt
    llama.cpp read and the ids it sampled, and every prompt llama.cpp read after the first is
    the previous prompt plus the ids llama.cpp sampled, exactly, then the new items: the engine
    continued from the carried ids, never re-rendering what llama.cpp wrote."""
    route = {"backend": "tokens", "api": "llamacpp", "base_url": recorder.url, "model": "tiny"}
    router = _router(**route, tokenizer=str(llama.tokenizer), read_timeout=60)
    server = await engine_for(router, default_model="tiny", park_seconds=0, hydration_cache_bytes=0)
    history: list[dict[str, Any]] = []
    async with aiohttp.ClientSession() as http:
        for text in ("hello", "again", "and once more"):
            history.append({"role": "user", "content": text})
            body = {"model": "tiny", "input": history, "store": False, "max_output_tokens": 6,
                    "include": ["output[*].token_ids"]}  # fmt: skip
            async with http.post(f"{server.base_url}/responses", json=body) as resp:
                answer = await resp.json()
                assert resp.status == 200, answer
            last = answer["output"][-1]
            turn = recorder.turns[-1]
            assert last["prompt_token_ids"] == turn.prompt  # what llama.cpp read
            assert last["generation_token_ids"] == turn.answer and turn.answer
            assert len(last["generation_log_probs"]) == len(turn.answer)
            history += answer["output"]  # sent back as received, the fields included
    assert len(recorder.turns) == 3
    for before, after in itertools.pairwise(recorder.turns):
        head = before.prompt + before.answer
        assert len(after.prompt) > len(head)
        assert after.prompt[: len(head)] == head
    assert backend_stats(server)["render.carried"] == 2


def backend_stats(server: LiveServer) -> dict[str, int]:
    return dict(server.engine.router.backend_of("tiny").stats)
