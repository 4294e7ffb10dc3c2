"""Local upstream peers: a chat-completions server streaming exactly as vLLM/OpenAI do, and a
small Responses SSE server. Both record every request the engine sends them.

Each request takes the next scripted ``Reply`` from the peer's queue; with the queue empty the
peer answers by a fixed policy (call the first tool after a user turn, else summarise the tool
results), which is enough to drive multi-turn tool loops.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.support.server import serve_app

SECRET = "sk-test-SECRET-0123456789abcdef"  # the upstream key the tests put in the environment


@dataclass
class Call:
    name: str
    arguments: str  # a custom tool call's input when ``custom``
    call_id: str
    namespace: str | None = None  # Responses peer only
    custom: bool = False  # Responses peer only: a custom_tool_call


@dataclass
class Reply:
    """One scripted answer. ``status`` >= 400 answers with that error instead of a stream."""

    text: str = ""
    calls: list[Call] = field(default_factory=list)
    finish: str | None = None  # default: "tool_calls" when calls else "stop"
    usage: dict[str, Any] | None = field(
        default_factory=lambda: {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
    )
    status: int = 200
    error_body: Any = None
    delay: float = 0.0  # seconds between chunks (a slow stream)
    cut_after: int | None = None  # drop the connection after this many chunks
    done: bool = True  # send ``data: [DONE]``
    header_delay: float = 0.0  # seconds before the response headers


def _port(request: web.Request) -> int:
    peer = request.transport.get_extra_info("peername") if request.transport else None
    return int(peer[1]) if peer else 0


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    client_port: int = 0  # the TCP connection it came on (pooling)


class Peer:
    """Shared plumbing: an aiohttp app on 127.0.0.1, a script queue, a request log."""

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self.script: deque[Reply] = deque()
        self.disconnects = 0
        self.finished = 0
        self.runner: web.AppRunner | None = None
        self.port = 0
        self.gone = asyncio.Event()

    def queue(self, *replies: Reply) -> None:
        self.script.extend(replies)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def last(self) -> dict[str, Any]:
        return self.requests[-1].body

    async def start(self) -> None:
        app = web.Application()
        self.routes(app)
        self.runner, self.port = await serve_app(app)

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    def routes(self, app: web.Application) -> None:
        raise NotImplementedError

    async def _record(self, request: web.Request) -> tuple[dict[str, Any], Reply]:
        body = await request.json()
        self.requests.append(Recorded(request.path, dict(request.headers), body, _port(request)))
        reply = self.script.popleft() if self.script else self.policy(body)
        if reply.header_delay:
            await asyncio.sleep(reply.header_delay)
        return body, reply

    def policy(self, body: dict[str, Any]) -> Reply:
        raise NotImplementedError

    async def _stream(
        self, request: web.Request, reply: Reply, frames: list[bytes]
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            for index, frame in enumerate(frames):
                if reply.cut_after is not None and index >= reply.cut_after:
                    assert request.transport is not None
                    request.transport.abort()  # a mid-stream disconnect
                    return resp
                if reply.delay and index:
                    await asyncio.sleep(reply.delay)
                await resp.write(frame)
            await resp.write_eof()
            self.finished += 1
        except (ConnectionResetError, asyncio.CancelledError):
            # The engine closed the request: the whole point of the cancellation tests.
            self.disconnects += 1
            self.gone.set()
            raise
        return resp


def sse(data: Any, event: str | None = None) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


def error_response(reply: Reply) -> web.Response:
    body = reply.error_body or {"error": {"message": "bad", "type": "invalid_request_error"}}
    return web.json_response(body, status=reply.status)


def split(text: str, size: int = 4) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


# =========================================================================== chat completions


class ChatPeer(Peer):
    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self.handle)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body, reply = await self._record(request)
        if reply.status >= 400:
            return error_response(reply)
        return await self._stream(request, reply, chat_frames(reply, body["model"]))

    def policy(self, body: dict[str, Any]) -> Reply:
        messages = body["messages"]
        last = messages[-1]
        if last["role"] == "user" and body.get("tools"):
            name = body["tools"][0]["function"]["name"]
            turn = sum(1 for m in messages if m["role"] == "user")
            return Reply(
                calls=[Call(name, '{"city":"Paris"}', f"call_auto_{turn}_{len(messages)}")]
            )
        if last["role"] == "tool":
            results = [m["content"] for m in messages if m["role"] == "tool"]
            return Reply(text="Tool said: " + "; ".join(results))
        return Reply(text=f"Echo: {last.get('content')}")


def chat_frames(reply: Reply, model: str) -> list[bytes]:
    """The exact chunk sequence vLLM/OpenAI send for one streamed completion."""
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": model}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return sse({**base, "choices": [choice]})

    frames = [chunk({"role": "assistant", "content": ""})]
    frames += [chunk({"content": piece}) for piece in split(reply.text) if piece]
    for index, call in enumerate(reply.calls):
        head = {"index": index, "id": call.call_id, "type": "function"}
        head["function"] = {"name": call.name, "arguments": ""}
        frames.append(chunk({"tool_calls": [head]}))
        for piece in split(call.arguments, 5):
            frames.append(
                chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            )
    finish = reply.finish or ("tool_calls" if reply.calls else "stop")
    frames.append(chunk({}, finish))
    if reply.usage is not None:
        frames.append(sse({**base, "choices": [], "usage": reply.usage}))
    if reply.done:
        frames.append(sse("[DONE]"))
    return frames


# =========================================================================== responses


class ResponsesPeer(Peer):
    def __init__(self) -> None:
        super().__init__()
        self.counter = 0

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/responses", self.handle)
        app.router.add_post("/v1/responses/compact", self.compact)

    async def compact(self, request: web.Request) -> web.Response:
        """Like OpenAI's: the user messages stay, the rest becomes one opaque blob of its own."""
        body = await request.json()
        self.requests.append(Recorded(request.path, dict(request.headers), body, _port(request)))
        if self.script and self.script[0].status >= 400:
            return error_response(self.script.popleft())
        self.counter += 1
        kept = [i for i in body["input"] if i.get("role") == "user"]
        blob = {"type": "compaction", "id": f"cmp_up_{self.counter}"}
        blob["encrypted_content"] = f"upstream-blob-{self.counter}"
        usage: dict[str, Any] = {"input_tokens": 321, "output_tokens": 45, "total_tokens": 366}
        usage |= {"input_tokens_details": {"cached_tokens": 0}}
        usage |= {"output_tokens_details": {"reasoning_tokens": 0}}
        return web.json_response(
            {"id": "resp_c", "object": "response.compaction", "created_at": 1}
            | {"output": [*kept, blob], "usage": usage}
        )

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body, reply = await self._record(request)
        if reply.status >= 400:
            return error_response(reply)
        self.counter += 1
        frames = responses_frames(reply, body["model"], f"resp_up_{self.counter}")
        return await self._stream(request, reply, frames)

    def policy(self, body: dict[str, Any]) -> Reply:
        items = body["input"]
        last = items[-1] if items else {}
        if last.get("role") == "user" and body.get("tools"):
            name = body["tools"][0]["name"]
            return Reply(calls=[Call(name, '{"city":"Paris"}', f"call_r{len(items)}")])
        if last.get("type") == "function_call_output":
            return Reply(text=f"Tool said: {last['output']}")
        return Reply(text="Hello from upstream")


def responses_frames(reply: Reply, model: str, response_id: str) -> list[bytes]:
    """A Responses SSE stream: created, items with their deltas, then the terminal event."""
    seq = iter(range(10_000))
    snapshot: dict[str, Any] = {"id": response_id, "object": "response", "model": model}
    snapshot |= {"created_at": int(time.time()), "status": "in_progress", "output": []}

    def event(kind: str, **fields: Any) -> bytes:
        return sse({"type": kind, "sequence_number": next(seq), **fields}, event=kind)

    frames = [event("response.created", response=snapshot)]
    output: list[dict[str, Any]] = []
    item: dict[str, Any]
    done: dict[str, Any]
    if reply.text:
        item = {"type": "message", "id": "msg_up", "role": "assistant"}
        item |= {"status": "in_progress"}
        frames.append(
            event("response.output_item.added", output_index=0, item=item | {"content": []})
        )
        for piece in split(reply.text):
            frames.append(event("response.output_text.delta", item_id="msg_up", delta=piece))
        content = [{"type": "output_text", "text": reply.text, "annotations": []}]
        done = item | {"status": "completed", "content": content}
        frames.append(event("response.output_item.done", output_index=0, item=done))
        output.append(done)
    for call in reply.calls:
        kind, field_, delta = (
            ("custom_tool_call", "input", "response.custom_tool_call_input.delta")
            if call.custom
            else ("function_call", "arguments", "response.function_call_arguments.delta")
        )
        item = {"type": kind, "id": f"fc_{call.call_id}"}
        item |= {"call_id": call.call_id, "name": call.name, field_: ""}
        item |= {"status": "in_progress"}
        if call.namespace:
            item["namespace"] = call.namespace
        frames.append(event("response.output_item.added", output_index=len(output), item=item))
        for piece in split(call.arguments, 5):
            frames.append(event(delta, delta=piece))
        done = item | {field_: call.arguments, "status": "completed"}
        frames.append(event("response.output_item.done", output_index=len(output), item=done))
        output.append(done)
    final = snapshot | {"output": output}
    if reply.usage is not None:
        usage = reply.usage
        final["usage"] = {
            "input_tokens": usage["prompt_tokens"],
            "output_tokens": usage["completion_tokens"],
            "total_tokens": usage["total_tokens"],
        }
    if reply.finish == "failed":
        error = {"code": "server_error", "message": f"upstream broke, key {SECRET}"}
        frames.append(
            event("response.failed", response=final | {"status": "failed", "error": error})
        )
    elif reply.finish == "length":
        final |= {"status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}}
        frames.append(event("response.incomplete", response=final))
    else:
        frames.append(event("response.completed", response=final | {"status": "completed"}))
    return frames
