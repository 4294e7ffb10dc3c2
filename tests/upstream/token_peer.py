"""A token-in/token-out upstream for tests: vLLM's ``/inference/v1/generate``, SGLang's
``/generate`` and llama.cpp's ``/completion``, each in the shape its source documents (see
``engine/models/tokens/servers/`` for the files), with a tokenizer the test trains and a
Qwen-style chat template the test writes (nothing is downloaded).

It checks what arrives: every prompt is recorded with the ids the peer sampled for it, and
``extends`` says whether a prompt starts with an earlier prompt plus its answer, exactly. It
samples as a model may, not as a tokenizer encodes (TOK-42): ordinary text one character at a
time (``sample_ids``), a tokenization ``encode`` never produces, so an engine that re-encoded
the history would send different ids and fail the prefix check, even where the template is
append-only. It honours the step's output limit (vLLM ``max_tokens``, SGLang
``max_new_tokens``, llama.cpp ``n_predict``): a cut answer has no end id and finishes
``length``.
The answer policy reads the decoded prompt like the chat peer reads messages: after a user
turn with tools declared it calls the first tool, after tool results it summarises them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from tokenizers import Tokenizer

from clients.bench.services.tiny_model import QWEN_TEMPLATE, make_tokenizer
from engine.models.config import build_router, parse_config
from engine.models.router import Router
from engine.models.tokens.backend import TokensBackend
from tests.support.server import LiveServer

__all__ = ["QWEN_TEMPLATE", "TokenPeer", "TokenTurn", "make_tokenizer"]
_LIMIT_KEYS = {"vllm": "max_tokens", "sglang": "max_new_tokens", "llamacpp": "n_predict"}


def _limit(api: str, body: dict[str, Any]) -> int | None:
    """The request's output limit in its API's field (llama.cpp: a negative is none)."""
    knobs = body if api == "llamacpp" else body.get("sampling_params", {})
    limit = knobs.get(_LIMIT_KEYS[api])
    return limit if isinstance(limit, int) and limit >= 0 else None


@dataclass
class TokenTurn:
    api: str
    body: dict[str, Any]
    prompt: list[int]
    answer: list[int] = field(default_factory=list)
    cut: bool = False  # the answer hit the request's output limit (finish ``length``)


class TokenPeer:
    """One server for all three APIs (the path says which); records every turn."""

    def __init__(self, tokenizer_dir: Path, *, eos_in_tokens: bool = True) -> None:
        self.tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
        # The tokenizer's added tokens (``<|im_end|>``, ``[TOOL_CALLS]``, …) are sampled as
        # their one id, as a model samples them; every other character alone (TOK-42).
        added = sorted(
            (t.content for t in self.tokenizer.get_added_tokens_decoder().values()),
            key=len,
            reverse=True,
        )
        self._added = re.compile("(" + "|".join(map(re.escape, added or ["<|im_end|>"])) + ")")
        self.end_id = self._special("<|im_end|>")
        self.turns: list[TokenTurn] = []
        # What to sample next, before the policy: a text (sampled as ``sample_ids`` says) or the
        # exact ids (a model's own split of a text, e.g. a word in two tokens, TOK-62).
        self.script: deque[str | list[int]] = deque()
        self.eos_in_tokens = eos_in_tokens
        # After an answer's first chunk: wait for ``resume`` (set: no wait) and say so in
        # ``paused``; then, with ``fail_midway``, end with an error chunk (TOK-43's endings).
        self.resume = asyncio.Event()
        self.resume.set()
        self.paused = asyncio.Event()
        self.fail_midway = False
        # SGLang's ``--incremental-streaming-output``: each chunk carries only its new ids and
        # their logprobs (TOK-32).
        self.sglang_incremental = False
        # A lossy server: this many sampled ids of the second chunk never reach the stream,
        # while its counts report every id sampled (TOK-33).
        self.lose = 0
        self.runner: web.AppRunner | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/inference/v1/generate", self._vllm)
        app.router.add_post("/generate", self._sglang)
        app.router.add_post("/completion", self._llamacpp)
        self.runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        assert site._server is not None
        self.port = site._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    # ------------------------------------------------------------------ checks
    def extends(self, index: int) -> int | None:
        """The earlier turn whose prompt + answer turn ``index``'s prompt starts with exactly
        (the latest such), or None (a conversation's first turn, or a re-render)."""
        prompt = self.turns[index].prompt
        for earlier in range(index - 1, -1, -1):
            turn = self.turns[earlier]
            head = turn.prompt + turn.answer
            if len(prompt) > len(head) and prompt[: len(head)] == head:
                return earlier
        return None

    def text(self, ids: list[int]) -> str:
        decoded: str = self.tokenizer.decode(ids, skip_special_tokens=False)
        return decoded

    # ------------------------------------------------------------------ the answer
    def _answer(self, api: str, body: dict[str, Any], prompt: list[int]) -> TokenTurn:
        turn = TokenTurn(api, body, list(prompt))
        self.turns.append(turn)
        step = self.script.popleft() if self.script else self._policy(self.text(prompt))
        answer = [*(step if isinstance(step, list) else self.sample_ids(step)), self.end_id]
        limit = _limit(api, body)
        turn.cut = limit is not None and len(answer) > limit
        turn.answer = answer[:limit] if turn.cut else answer
        return turn

    def _special(self, text: str) -> int:
        token_id = self.tokenizer.token_to_id(text)
        assert token_id is not None, text
        return token_id

    def sample_ids(self, text: str) -> list[int]:
        """``text`` as sampled ids: special-token text as its one id, every other character
        encoded alone (``"ab"`` -> ids of ``"a"`` + ids of ``"b"``, never the merge)."""
        ids: list[int] = []
        for n, part in enumerate(self._added.split(text)):
            if n % 2:
                ids.append(self._special(part))
                continue
            for char in part:
                ids += self.tokenizer.encode(char, add_special_tokens=False).ids
        return ids

    @staticmethod
    def _policy(prompt: str) -> str:
        turns = prompt.split("<|im_start|>")
        last = turns[-2] if len(turns) >= 2 else ""
        if "<tool_response>" in last:
            results = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", last, re.S)
            return "Tool said: " + "; ".join(results)
        tools = re.search(r"<tools>\n(.*?)\n</tools>", prompt, re.S)
        if last.startswith("user") and tools:
            name = json.loads(tools.group(1).splitlines()[0])["function"]["name"]
            call = {"name": name, "arguments": {"city": "Paris"}}
            return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
        return "Echo: " + last.removeprefix("user\n").removesuffix("<|im_end|>\n")

    def _pieces(self, ids: list[int]) -> list[list[int]]:
        return [ids[n : n + 3] for n in range(0, len(ids), 3)]

    def _streamed(self, pieces: list[list[int]]) -> list[list[int]]:
        """The pieces as sent: the second loses ``lose`` ids when the peer is lossy."""
        if not self.lose or len(pieces) < 2:
            return pieces
        return [pieces[0], pieces[1][self.lose :], *pieces[2:]]

    @staticmethod
    def _logprob(n: int) -> float:
        return -0.01 * (n % 7 + 1)

    async def _stream(self, request: web.Request, frames: list[Any]) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        with contextlib.suppress(ConnectionResetError):  # the engine stopped reading (a cancel)
            await self._frames(resp, frames)
        return resp

    async def _frames(self, resp: web.StreamResponse, frames: list[Any]) -> None:
        for n, frame in enumerate(frames):
            payload = frame if isinstance(frame, str) else json.dumps(frame)
            await resp.write(f"data: {payload}\n\n".encode())
            await asyncio.sleep(0)
            if n == 0 and not self.resume.is_set():
                self.paused.set()
                await self.resume.wait()
            if n == 0 and self.fail_midway:
                await resp.write(b'data: {"error": {"message": "the model crashed"}}\n\n')
                break
        await resp.write_eof()

    # ------------------------------------------------------------------ vLLM
    async def _vllm(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        turn = self._answer("vllm", body, body["token_ids"])
        frames: list[Any] = []
        done = 0
        pieces = self._streamed(self._pieces(turn.answer))
        for index, piece in enumerate(pieces):
            content = [
                {"token": f"token_id:{t}", "logprob": self._logprob(done + k), "top_logprobs": []}
                for k, t in enumerate(piece)
            ]
            done += len(piece)
            finish = ("length" if turn.cut else "stop") if index == len(pieces) - 1 else None
            choice = {
                "index": 0,
                "logprobs": {"content": content},
                "finish_reason": finish,
                "token_ids": piece,
            }
            frames.append({"request_id": "generate-tokens-1", "choices": [choice]})
        usage = {
            "prompt_tokens": len(turn.prompt),
            "completion_tokens": len(turn.answer),
            "total_tokens": len(turn.prompt) + len(turn.answer),
        }
        frames.append({"request_id": "generate-tokens-1", "choices": [], "usage": usage})
        frames.append("[DONE]")
        return await self._stream(request, frames)

    # ------------------------------------------------------------------ SGLang
    async def _sglang(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        turn = self._answer("sglang", body, body["input_ids"])
        frames: list[Any] = []
        sent: list[int] = []
        pieces = self._pieces(turn.answer)
        streamed = self._streamed(pieces)
        sampled = 0  # what the server sampled so far (its count), lossy or not
        for index, piece in enumerate(streamed):
            sampled += len(pieces[index])
            new = [[self._logprob(len(sent) + n), t, None] for n, t in enumerate(piece)]
            sent += piece
            last = index == len(pieces) - 1
            meta = {
                "id": "rid-1",
                "finish_reason": _sglang_finish(turn, self.end_id) if last else None,
                "prompt_tokens": len(turn.prompt),
                "completion_tokens": sampled,
                "cached_tokens": 0,
                "output_token_logprobs": (
                    new
                    if self.sglang_incremental
                    else [[self._logprob(n), t, None] for n, t in enumerate(sent)]
                ),
            }
            ids = piece if self.sglang_incremental else sent
            frames.append({"text": self.text(ids), "output_ids": list(ids), "meta_info": meta})
        frames.append("[DONE]")
        return await self._stream(request, frames)

    # ------------------------------------------------------------------ llama.cpp
    async def _llamacpp(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        turn = self._answer("llamacpp", body, body["prompt"])
        ends = bool(turn.answer) and not turn.cut
        streamed = turn.answer if self.eos_in_tokens or not ends else turn.answer[:-1]
        if streamed is not turn.answer:
            turn.answer = streamed  # what the engine was sent is what it must keep
        frames: list[Any] = []
        done = 0
        whole = self._pieces(streamed)
        for index, piece in enumerate(self._streamed(whole)):
            probs = [
                {
                    "id": t,
                    "token": self.text([t]),
                    "bytes": [],
                    "logprob": self._logprob(done + k),
                    "top_logprobs": [],
                }
                for k, t in enumerate(piece)
            ]
            done += len(piece)
            sampled = sum(len(p) for p in whole[: index + 1])  # llama.cpp's n_decoded
            frames.append(
                {
                    "index": 0,
                    "content": self.tokenizer.decode(piece),
                    "tokens": piece,
                    "stop": False,
                    "id_slot": 0,
                    "tokens_predicted": sampled,
                    "tokens_evaluated": len(turn.prompt),
                    "completion_probabilities": probs,
                }
            )
        frames.append(
            {
                "index": 0,
                "content": "",
                "tokens": [],
                "id_slot": 0,
                "stop": True,
                "model": "tiny",
                "tokens_predicted": len(turn.answer),
                "tokens_evaluated": len(turn.prompt),
                "stop_type": "limit" if turn.cut else "eos",
                "stopping_word": "",
                "tokens_cached": len(turn.prompt),
                "timings": {"prompt_n": len(turn.prompt), "cache_n": 0},
            }
        )
        if body.get("stream") is False:  # one body with every id, as llama.cpp answers (TOK-44)
            final = frames[-1]
            final["tokens"] = [t for frame in frames[:-1] for t in frame["tokens"]]
            final["completion_probabilities"] = [
                p for frame in frames[:-1] for p in frame["completion_probabilities"]
            ]
            final["content"] = self.tokenizer.decode(final["tokens"])
            return web.json_response(final)
        return await self._stream(request, frames)


def _sglang_finish(turn: TokenTurn, end_id: int) -> dict[str, Any]:
    if turn.cut:
        return {"type": "length", "length": len(turn.answer)}
    return {"type": "stop", "matched": end_id}


# ------------------------------------------------------------------ shared by the tokens tests


def tokens_router(peer: TokenPeer, tokenizer: Path, api: str, **extra: Any) -> Router:
    route = {
        "backend": "tokens",
        "api": api,
        "base_url": peer.base_url,
        "model": "tiny",
        "tokenizer": str(tokenizer),
        **extra,
    }
    return build_router(parse_config({"default": "model-a", "models": {"model-a": route}}))


def backend_of(server: LiveServer) -> TokensBackend:
    backend = server.engine.router.backend_of("model-a")
    assert isinstance(backend, TokensBackend)
    return backend


def assert_exact(peer: TokenPeer, firsts: int = 1) -> None:
    """Every turn after each conversation's first extends the turn before it exactly."""
    follow = [peer.extends(n) for n in range(len(peer.turns))]
    assert follow.count(None) == firsts, follow
    for n, earlier in enumerate(follow):
        assert earlier is None or earlier == n - 1, follow
