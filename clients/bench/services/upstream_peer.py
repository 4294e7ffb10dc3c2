"""The upstream of ``rollout bench --upstream-kind`` (BENCH-9): one loopback server that is
both a chat-completions server and a vLLM token-in server for the same tiny model, and counts
the work each kind of request makes it do.

* ``POST /v1/chat/completions`` does what a chat server does every turn: applies the chat
  template to the whole message list and tokenizes the result (``chars_tokenized`` grows with
  the history);
* ``POST /inference/v1/generate`` reads the ids as they are (``chars_tokenized`` 0); a request
  for the model ``harmony`` is gpt-oss's harmony route and is answered in o200k harmony ids
  (reasoning, then the call).

Both answer with the same scripted tool call (the client decides when the rollout ends), so the
only difference between the two routes is the work on either side of the wire.
"""

from __future__ import annotations

import asyncio
import gzip
import importlib.util
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from aiohttp import web
from jinja2.sandbox import ImmutableSandboxedEnvironment
from openai_harmony import HarmonyEncoding, HarmonyEncodingName, load_harmony_encoding
from tokenizers import Tokenizer

from clients.bench.suites.codex import TOOL_NAMES


@dataclass
class UpstreamTurn:
    kind: str  # "chat" | "tokens"
    request_bytes: int
    chars_tokenized: int  # text the upstream had to template and tokenize
    prompt_tokens: int


@dataclass
class BenchUpstream:
    tokenizer_dir: Path
    turns: list[UpstreamTurn] = field(default_factory=list)
    port: int = 0
    _runner: web.AppRunner | None = None
    _harmony: HarmonyEncoding | None = None

    def __post_init__(self) -> None:
        # What a model server does with its tokenizer files: Hugging Face's tokenizer, the
        # config's Jinja chat template (rendered like transformers' apply_chat_template).
        self.tokenizer = Tokenizer.from_file(str(self.tokenizer_dir / "tokenizer.json"))
        config = json.loads((self.tokenizer_dir / "tokenizer_config.json").read_text())
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.filters["tojson"] = lambda value, indent=None: json.dumps(
            value, ensure_ascii=False, indent=indent
        )
        self.template = env.from_string(config["chat_template"])
        self.end_id = self.tokenizer.token_to_id(config["eos_token"])

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=False).ids
        return ids

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/inference/v1/generate", self._tokens)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = cast(asyncio.Server, site._server)  # uvloop's Server has the same sockets
        self.port = server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def harmony(self) -> HarmonyEncoding:
        """gpt-oss's encoding for the harmony route's answers, with the o200k_base vocabulary
        bpe-openai bundles unpacked next to the tokenizer (nothing is downloaded)."""
        if self._harmony is None:
            if not os.environ.get("TIKTOKEN_ENCODINGS_BASE"):
                spec = importlib.util.find_spec("bpe_openai")
                assert spec is not None and spec.origin is not None
                bundled = Path(spec.origin).parent / "data" / "o200k_base.tiktoken.gz"
                target = self.tokenizer_dir / "o200k_base.tiktoken"
                target.write_bytes(gzip.decompress(bundled.read_bytes()))
                os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(self.tokenizer_dir)
            self._harmony = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
        return self._harmony

    def _call(self) -> dict[str, Any]:
        name = TOOL_NAMES[len(self.turns) % len(TOOL_NAMES)]
        return {"name": name, "arguments": {"path": "src/dispatch.py"}}

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = json.loads(raw)
        messages = body["messages"]
        for message in messages:  # as vLLM does before templating
            for call in message.get("tool_calls") or ():
                call["function"]["arguments"] = json.loads(call["function"]["arguments"])
        tools = body.get("tools") or None
        text = self.template.render(messages=messages, tools=tools, add_generation_prompt=True)
        prompt = self.encode(text)
        self.turns.append(UpstreamTurn("chat", len(raw), len(text), len(prompt)))
        call = self._call()
        args = json.dumps(call["arguments"])
        head: dict[str, Any] = {"index": 0, "id": f"call_{len(self.turns)}", "type": "function"}
        chunks: list[dict[str, Any]] = [
            {"tool_calls": [{**head, "function": {"name": call["name"], "arguments": ""}}]},
            {"tool_calls": [{"index": 0, "function": {"arguments": args}}]},
        ]
        frames: list[Any] = [
            {"choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in chunks
        ]
        frames.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
        answer = len(self.encode(args)) + 8
        usage = {"prompt_tokens": len(prompt), "completion_tokens": answer}
        frames.append({"choices": [], "usage": usage})
        return await _stream(request, [*frames, "[DONE]"])

    async def _tokens(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = json.loads(raw)
        prompt = body["token_ids"]
        kind = "harmony" if body.get("model") == "harmony" else "tokens"
        self.turns.append(UpstreamTurn(kind, len(raw), 0, len(prompt)))
        call = self._call()
        if kind == "harmony":
            text = (
                "<|channel|>analysis<|message|>I should read the file first.<|end|>"
                f"<|start|>assistant<|channel|>commentary to=functions.{call['name']} "
                f"<|constrain|>json<|message|>{json.dumps(call['arguments'])}<|call|>"
            )
            ids = self.harmony().encode(text, allowed_special="all")
        else:
            text = f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
            ids = [*self.encode(text), cast(int, self.end_id)]
        content = [{"token": f"token_id:{t}", "logprob": -0.1} for t in ids]
        choice = {"index": 0, "token_ids": ids, "logprobs": {"content": content}}
        frames: list[Any] = [{"choices": [{**choice, "finish_reason": "stop"}]}]
        usage = {"prompt_tokens": len(prompt), "completion_tokens": len(ids)}
        frames.append({"choices": [], "usage": usage})
        return await _stream(request, [*frames, "[DONE]"])


async def _stream(request: web.Request, frames: list[Any]) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for frame in frames:
        payload = frame if isinstance(frame, str) else json.dumps(frame)
        await resp.write(f"data: {payload}\n\n".encode())
    await resp.write_eof()
    return resp
