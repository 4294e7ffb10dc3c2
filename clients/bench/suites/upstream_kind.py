"""``rollout bench --upstream-kind chat,tokens,harmony`` (BENCH-9): the codex-shaped scenario
through a ``chat`` route, a ``tokens`` route and (``harmony``) a gpt-oss harmony ``tokens``
route, side by side in one run, against one loopback upstream (``upstream_peer``) serving the
same tiny model both ways (and harmony's o200k ids for the harmony route).

Per turn (one ``response.create`` in WebSocket standard mode, ``store: false``, the codex
instructions, tools and tool outputs of ``clients/bench/suites/codex.py``):

* ``engine_cpu_ms``: the server process's CPU, all threads (``/proc/PID/task/*/schedstat``),
  from the create's send to its ``response.completed``;
* ``upstream_chars``: text the upstream had to template and tokenize for that turn (the whole
  history for ``chat``, 0 for ``tokens``);
* ``request_bytes``: the body the engine sent upstream;
* ``ttft_ms``: send to the first output event at the client.

The tiny model's tokenizer is trained here, so nothing is downloaded.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from clients.bench.proc import ServerProcess, process_cpu_ns
from clients.bench.scenario import Call
from clients.bench.services.tiny_model import make_tokenizer
from clients.bench.services.upstream_peer import BenchUpstream
from clients.bench.suites.codex import TOOL_NAMES, CodexTools, generated_output, instructions

KINDS = ("chat", "tokens", "harmony")


def _tokenizer(directory: Path) -> Path:
    """A tokenizer trained on the scenario's own kind of text (instructions, tool outputs), so
    it compresses like a real one (a few characters a token) rather than byte by byte."""
    corpus = [instructions(), *(generated_output(n, i, 4000) for i, n in enumerate(TOOL_NAMES))]
    return make_tokenizer(directory, corpus=corpus, vocab_size=8000)


def _route(kind: str, upstream: BenchUpstream) -> str:
    if kind == "chat":
        return f'backend = "chat"\nbase_url = "{upstream.base_url}/v1"\nmodel = "tiny"\n'
    if kind == "harmony":  # gpt-oss's format: the engine renders with openai-harmony
        return (
            f'backend = "tokens"\napi = "vllm"\nbase_url = "{upstream.base_url}"\n'
            'model = "harmony"\ntemplate = "harmony"\n'
        )
    return (
        f'backend = "tokens"\napi = "vllm"\nbase_url = "{upstream.base_url}"\nmodel = "tiny"\n'
        f'tokenizer = "{upstream.tokenizer_dir}"\n'
    )


async def run_upstream_kinds(kinds: list[str], calls: int, history_scale: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        upstream = BenchUpstream(_tokenizer(Path(tmp) / "tokenizer"))
        await upstream.start()
        try:
            runs: dict[str, list[dict[str, Any]]] = {}
            for kind in kinds:
                config = Path(tmp) / f"{kind}.toml"
                config.write_text(f'default = "bench"\n[models.bench]\n{_route(kind, upstream)}')
                async with ServerProcess(1000.0, config=config) as server:
                    runs[kind] = await _scenario(server, upstream, kind, calls, history_scale)
        finally:
            await upstream.stop()
    summary = summarize(runs)
    return {"calls": calls, "history_scale": history_scale, "runs": runs, "summary": summary}


async def _scenario(
    server: ServerProcess, upstream: BenchUpstream, kind: str, calls: int, scale: int
) -> list[dict[str, Any]]:
    tools = CodexTools(history_scale=scale)
    create: dict[str, Any] = {"type": "response.create", **tools.first_request("bench")}
    create["store"] = False
    url = server.url.replace("http://", "ws://") + "/responses"
    turns: list[dict[str, Any]] = []
    async with aiohttp.ClientSession() as http, http.ws_connect(url, max_msg_size=0) as ws:
        for turn in range(calls):
            seen = len(upstream.turns)
            cpu = process_cpu_ns(server.pid)
            sent = time.perf_counter()
            await ws.send_str(json.dumps(create))
            first, response = await _completed(ws)
            cpu_ms = (process_cpu_ns(server.pid) - cpu) / 1e6
            (up,) = upstream.turns[seen:]
            assert up.kind == kind
            turns.append(
                {
                    "turn": turn,
                    "engine_cpu_ms": cpu_ms,
                    "upstream_chars": up.chars_tokenized,
                    "upstream_prompt_tokens": up.prompt_tokens,
                    "request_bytes": up.request_bytes,
                    "ttft_ms": (first - sent) * 1000,
                }
            )
            call = next(i for i in response["output"] if i["type"] == "function_call")
            (result,) = await tools.run([Call(call["call_id"], call["name"], call["arguments"])])
            create = {
                "type": "response.create",
                **tools.first_request("bench"),
                "input": [result.item()],
                "previous_response_id": response["id"],
                "store": False,
            }
    return turns


async def _completed(ws: aiohttp.ClientWebSocketResponse) -> tuple[float, dict[str, Any]]:
    first = 0.0
    while True:
        frame = json.loads((await ws.receive(timeout=60)).data)
        kind = frame["type"]
        if kind in ("error", "response.failed"):
            raise RuntimeError(f"the bench turn failed: {frame}")
        if not first and kind == "response.output_item.added":
            first = time.perf_counter()
        if kind == "response.completed":
            return first, frame["response"]


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per kind: medians over the turns, and the first and last turns (growth with history)."""
    out: dict[str, Any] = {}
    for kind, turns in runs.items():
        row: dict[str, Any] = {}
        for key in ("engine_cpu_ms", "upstream_chars", "request_bytes", "ttft_ms"):
            values = [t[key] for t in turns]
            row[key] = {
                "median": statistics.median(values),
                "first": values[0],
                "last": values[-1],
            }
        row["prompt_tokens_last"] = turns[-1]["upstream_prompt_tokens"]
        out[kind] = row
    if "chat" in out:
        chat = out["chat"]["engine_cpu_ms"]["median"]
        for kind in ("tokens", "harmony"):
            if kind in out:
                ratio = out[kind]["engine_cpu_ms"]["median"] / max(chat, 1e-9)
                out[f"{kind}_vs_chat_engine_cpu"] = ratio
    return out


def render(doc: dict[str, Any]) -> str:
    lines = [f"upstream kinds, codex scenario, {doc['calls']} turns (median / first / last)"]
    for kind, row in doc["summary"].items():
        if not isinstance(row, dict):
            continue
        cells = [
            f"{key} {v['median']:.1f} / {v['first']:.1f} / {v['last']:.1f}"
            for key, v in row.items()
            if isinstance(v, dict)
        ]
        lines.append(f"  {kind:7s} " + "  ".join(cells))
    for kind in ("tokens", "harmony"):
        ratio = doc["summary"].get(f"{kind}_vs_chat_engine_cpu")
        if ratio is not None:
            lines.append(f"  engine CPU per turn, {kind} / chat: {ratio:.2f}x")
    return "\n".join(lines)
