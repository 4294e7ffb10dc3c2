"""The instant upstream of ``rollout bench --peers`` (BENCH-10): one loopback process that is
both an OpenAI chat-completions server and a Responses server, answering every request with
the same policy, at once, so that what is measured in front of it is the gateways' own work.

The policy: every request is answered with one call of the tool ``read_file`` (arguments
``{"path": "src/dispatch.py"}``), with usage counted from the request's size (no tokenizer);
the client decides when the chain ends. ``stream`` true or false, as asked. A Responses
request naming ``previous_response_id`` is refused (400): the stub keeps no state, so a
gateway that only passes the id through cannot run a stateful chain in front of it.

Run as ``python -m clients.bench.peer_stub``: it prints ``PORT <n>`` once listening, and runs
in its own process so that its CPU time is read apart from the gateways'.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
import time
from typing import Any

from aiohttp import web

TOOL = "read_file"
ARGUMENTS = json.dumps({"path": "src/dispatch.py"})
_ids = itertools.count(1)


def _usage(raw: bytes, chat: bool) -> dict[str, Any]:
    prompt, completion = len(raw) // 4, 12
    if chat:
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
    return {
        "input_tokens": prompt,
        "output_tokens": completion,
        "total_tokens": prompt + completion,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0},
    }


async def _sse(request: web.Request, frames: list[str]) -> web.StreamResponse:
    """The whole answer in one write: the stub costs the same for every gateway."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write("".join(frames).encode())
    await resp.write_eof()
    return resp


async def chat(request: web.Request) -> web.StreamResponse:
    raw = await request.read()
    body = json.loads(raw)
    n = next(_ids)
    call = {"index": 0, "id": f"call_{n}", "type": "function"}
    usage = _usage(raw, chat=True)
    head = {"id": f"chatcmpl-{n}", "object": "chat.completion.chunk", "created": int(time.time())}
    head["model"] = body.get("model", "stub")
    if not body.get("stream"):
        message = {
            "role": "assistant",
            "content": None,
            "tool_calls": [{**call, "function": {"name": TOOL, "arguments": ARGUMENTS}}],
        }
        choice = {"index": 0, "message": message, "finish_reason": "tool_calls"}
        answer = {**head, "object": "chat.completion", "choices": [choice], "usage": usage}
        return web.json_response(answer)
    opening = {**call, "function": {"name": TOOL, "arguments": ""}}
    deltas: list[dict[str, Any]] = [
        {"role": "assistant", "tool_calls": [opening]},
        {"tool_calls": [{"index": 0, "function": {"arguments": ARGUMENTS}}]},
    ]
    chunks = [
        {**head, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas
    ]
    end = {"index": 0, "delta": {}, "finish_reason": "tool_calls"}
    chunks += [{**head, "choices": [end]}, {**head, "choices": [], "usage": usage}]
    frames = [f"data: {json.dumps(c)}\n\n" for c in chunks]
    return await _sse(request, [*frames, "data: [DONE]\n\n"])


async def responses(request: web.Request) -> web.StreamResponse:
    raw = await request.read()
    body = json.loads(raw)
    if body.get("previous_response_id"):
        error = {"message": "this upstream keeps no state", "type": "invalid_request_error"}
        return web.json_response({"error": error}, status=400)
    n = next(_ids)
    item = {
        "id": f"fc_{n}",
        "type": "function_call",
        "status": "completed",
        "call_id": f"call_{n}",
        "name": TOOL,
        "arguments": ARGUMENTS,
    }
    response: dict[str, Any] = {
        "id": f"resp_stub{n}",
        "object": "response",
        "created_at": int(time.time()),
        "status": "in_progress",
        "model": body.get("model", "stub"),
        "output": [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": body.get("tools") or [],
    }
    done = {**response, "status": "completed", "output": [item], "usage": _usage(raw, False)}
    if not body.get("stream"):
        return web.json_response(done)
    added = {**item, "status": "in_progress", "arguments": ""}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": response},
        {"type": "response.in_progress", "response": response},
        {"type": "response.output_item.added", "output_index": 0, "item": added},
        {
            "type": "response.function_call_arguments.delta",
            "item_id": item["id"],
            "output_index": 0,
            "delta": ARGUMENTS,
        },
        {
            "type": "response.function_call_arguments.done",
            "item_id": item["id"],
            "output_index": 0,
            "arguments": ARGUMENTS,
        },
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {"type": "response.completed", "response": done},
    ]
    frames = [
        f"event: {e['type']}\ndata: {json.dumps({**e, 'sequence_number': i})}\n\n"
        for i, e in enumerate(events)
    ]
    return await _sse(request, frames)


async def models(request: web.Request) -> web.Response:
    model = {"id": "stub", "object": "model", "created": 0, "owned_by": "bench"}
    return web.json_response({"object": "list", "data": [model]})


async def health(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def serve() -> None:
    app = web.Application(client_max_size=256 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1/responses", responses)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/healthz", health)
    runner = web.AppRunner(app, handle_signals=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server: Any = site._server
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    try:
        import uvloop

        uvloop.run(serve())
    except ImportError:  # pragma: no cover - non-POSIX
        asyncio.run(serve())
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
