"""The chat backend against the local peer over real HTTP: what goes up, errors, timeouts,
retries and cancellation (UP-1..UP-6). No engine here; see the functional tests for that."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator

import pytest

from engine.models.base import Delta, Finish, TextDelta
from engine.models.upstreams.chat import ChatBackend
from engine.models.upstreams.chat_wire import ChatOptions
from engine.models.upstreams.endpoint import Endpoint, UpstreamError, post_stream
from engine.models.upstreams.http_pool import HttpPool
from tests.upstream.conftest import KEY_ENV
from tests.upstream.peer import SECRET, ChatPeer, Reply
from tests.upstream.sampling import request

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
async def pool() -> AsyncIterator[HttpPool]:
    shared = HttpPool()
    try:
        yield shared
    finally:
        await shared.close()


def backend(peer: ChatPeer, pool: HttpPool, **endpoint: object) -> ChatBackend:
    settings: dict[str, object] = {"api_key_env": KEY_ENV, **endpoint}
    return ChatBackend(Endpoint(peer.base_url, **settings), pool, ChatOptions(model="up"))


async def collect(stream: AsyncGenerator[Delta, None]) -> list[Delta]:
    return [delta async for delta in stream]


async def test_request_line_headers_and_body(chat_peer: ChatPeer, pool: HttpPool) -> None:
    deltas = await collect(backend(chat_peer, pool).stream(request(HI, tools=[])))
    sent = chat_peer.requests[0]
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["Authorization"] == f"Bearer {SECRET}"
    assert sent.body["model"] == "up" and sent.body["stream"] is True
    assert deltas[-1] == Finish("stop", 7, input_tokens=11)


async def test_pool_reuses_one_connection(chat_peer: ChatPeer, pool: HttpPool) -> None:
    chat = backend(chat_peer, pool)
    for _ in range(3):
        await collect(chat.stream(request(HI, tools=[])))
    assert len(chat_peer.requests) == 3
    # The stream was read to its end after [DONE], so the connection went back to the pool:
    # all three requests arrived on one TCP connection (UP-6).
    assert len({sent.client_port for sent in chat_peer.requests}) == 1
    assert pool.connections_made == 1


@pytest.mark.parametrize("status", [400, 401, 404, 422])
async def test_4xx_keeps_status_and_a_safe_message(
    chat_peer: ChatPeer, pool: HttpPool, status: int
) -> None:
    body = {"error": {"message": f"Incorrect API key provided: {SECRET}. Bearer {SECRET}"}}
    chat_peer.queue(Reply(status=status, error_body=body))
    with pytest.raises(UpstreamError) as caught:
        await collect(backend(chat_peer, pool, retries=2).stream(request(HI, tools=[])))
    err = caught.value
    assert err.status == status and err.rejected
    assert SECRET not in err.message and "sk-test" not in err.message
    assert err.message.startswith(f"The model server rejected the request (HTTP {status}):")
    wire = err.protocol_error()
    assert wire is not None and wire.status == status and wire.code == "upstream_error"
    assert len(chat_peer.requests) == 1  # a 4xx is never retried


async def test_vllm_error_shape(chat_peer: ChatPeer, pool: HttpPool) -> None:
    body = {
        "object": "error",
        "message": "This model's maximum context length is 4096",
        "code": 400,
    }
    chat_peer.queue(Reply(status=400, error_body=body))
    with pytest.raises(UpstreamError, match="maximum context length is 4096"):
        await collect(backend(chat_peer, pool).stream(request(HI, tools=[])))


async def test_5xx_is_a_generic_server_error(chat_peer: ChatPeer, pool: HttpPool) -> None:
    chat_peer.queue(Reply(status=500, error_body={"error": {"message": "CUDA out of memory"}}))
    with pytest.raises(UpstreamError) as caught:
        await collect(backend(chat_peer, pool).stream(request(HI, tools=[])))
    assert caught.value.protocol_error() is None  # the client gets a generic server_error
    assert "CUDA" not in caught.value.message


async def test_retry_before_the_first_token(chat_peer: ChatPeer, pool: HttpPool) -> None:
    chat_peer.queue(Reply(status=503), Reply(cut_after=1), Reply(text="ok"))
    deltas = await collect(
        backend(chat_peer, pool, retries=2, retry_backoff=0).stream(request(HI, tools=[]))
    )
    assert [d for d in deltas if isinstance(d, TextDelta)] == [TextDelta("ok")]
    assert len(chat_peer.requests) == 3


async def test_no_retry_once_a_token_was_sent(chat_peer: ChatPeer, pool: HttpPool) -> None:
    chat_peer.queue(Reply(text="partial answer here", cut_after=3))
    chat = backend(chat_peer, pool, retries=3, retry_backoff=0)
    seen: list[Delta] = []
    with pytest.raises(UpstreamError) as caught:
        async with contextlib.aclosing(chat.stream(request(HI, tools=[]))) as stream:
            async for delta in stream:
                seen.append(delta)
    assert seen and not caught.value.rejected
    assert len(chat_peer.requests) == 1


async def test_stream_without_done_or_finish_is_an_error(
    chat_peer: ChatPeer, pool: HttpPool
) -> None:
    chat_peer.queue(Reply(text="abc", finish=None, usage=None, done=False, cut_after=2))
    with pytest.raises(UpstreamError, match=r"closed|connection"):
        await collect(backend(chat_peer, pool).stream(request(HI, tools=[])))


async def test_read_timeout(chat_peer: ChatPeer, pool: HttpPool) -> None:
    chat_peer.queue(Reply(text="slow words coming", delay=0.6))
    chat = backend(chat_peer, pool, read_timeout=0.2)
    with pytest.raises(UpstreamError, match="timed out") as caught:
        await collect(chat.stream(request(HI, tools=[])))
    assert caught.value.protocol_error() is None


async def test_the_read_timeout_counts_each_silence_not_the_whole_answer(
    chat_peer: ChatPeer, pool: HttpPool
) -> None:
    """UP-1, UP-9: ``read_timeout`` bounds the silence between two chunks; an answer whose
    chunks come in time passes, however long it lasts in all (here ~10 chunks, 0.15 s apart,
    under a 0.4 s timeout), and so does the next answer on the same pooled connection."""
    chat = backend(chat_peer, pool, read_timeout=0.4)
    for _ in range(2):
        chat_peer.queue(Reply(text="slow words coming in many small chunks", delay=0.15))
        deltas = await collect(chat.stream(request(HI, tools=[])))
        text = "".join(d.text for d in deltas if isinstance(d, TextDelta))
        assert text == "slow words coming in many small chunks"
    assert pool.connections_made == 1


async def test_connect_failure(pool: HttpPool) -> None:
    chat = ChatBackend(Endpoint("http://127.0.0.1:9/v1", connect_timeout=1), pool)
    with pytest.raises(UpstreamError, match="connection failed"):
        await collect(chat.stream(request(HI, tools=[])))


async def test_closing_the_stream_closes_the_upstream_request(
    chat_peer: ChatPeer, pool: HttpPool
) -> None:
    chat_peer.queue(Reply(text="a long and slow answer " * 20, delay=0.05))
    stream = backend(chat_peer, pool).stream(request(HI, tools=[]))
    async with contextlib.aclosing(stream):
        async for delta in stream:
            if isinstance(delta, TextDelta):
                break  # the consumer stops (what a cancelled rollout does)
    await asyncio.wait_for(chat_peer.gone.wait(), 2)
    assert chat_peer.disconnects == 1 and chat_peer.finished == 0


async def test_cancelling_the_consumer_task_closes_the_upstream_request(
    chat_peer: ChatPeer, pool: HttpPool
) -> None:
    chat_peer.queue(Reply(text="x " * 200, delay=0.05))
    first = asyncio.Event()

    async def consume() -> None:
        stream = backend(chat_peer, pool).stream(request(HI, tools=[]))
        async with contextlib.aclosing(stream):
            async for _ in stream:
                first.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first.wait(), 2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(chat_peer.gone.wait(), 2)


@pytest.mark.parametrize("where", ["header", "key"])
async def test_a_line_break_in_a_header_never_reaches_the_wire(
    chat_peer: ChatPeer, pool: HttpPool, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """UP-9: a configured header or an API key with a line break would smuggle a header (or a
    second request) upstream; the request fails and nothing is sent."""
    if where == "key":
        monkeypatch.setenv(KEY_ENV, "sk-abc\r\nX-Injected: 1")
        chat = backend(chat_peer, pool)
    else:
        chat = backend(chat_peer, pool, headers={"X-Team": "a\r\nX-Injected: 1"})
    with pytest.raises(UpstreamError, match="connection failed") as caught:
        await collect(chat.stream(request(HI, tools=[])))
    assert "Injected" not in caught.value.message and "sk-abc" not in caught.value.message
    assert chat_peer.requests == []
    assert pool.connections_made == 0


async def test_requests_beyond_max_connections_wait_for_a_slot(chat_peer: ChatPeer) -> None:
    """UP-6: with one connection allowed, two concurrent streams take turns on it."""
    small = HttpPool(max_connections=1)
    try:
        chat_peer.queue(Reply(text="first answer", delay=0.02))
        chat_peer.queue(Reply(text="second answer", delay=0.02))
        chat = backend(chat_peer, small)
        both = await asyncio.gather(
            collect(chat.stream(request(HI, tools=[]))), collect(chat.stream(request(HI, tools=[])))
        )
        assert all(isinstance(deltas[-1], Finish) for deltas in both)
        assert len({sent.client_port for sent in chat_peer.requests}) == 1
        assert small.connections_made == 1
    finally:
        await small.close()


def test_the_pool_streams_on_uvloop() -> None:
    """The server runs on uvloop, whose transports are not ``asyncio.Transport`` subclasses;
    the pool must stream and reuse its connection there too (not only on pytest's loop)."""
    import uvloop
    from aiohttp import web

    async def answer(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"n": 1}\n\ndata: [DONE]\n\n')
        return resp

    async def main() -> tuple[list[bytes], int]:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", answer)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        shared, bodies = HttpPool(), []
        try:
            for _ in range(2):
                endpoint = Endpoint(f"http://127.0.0.1:{port}/v1")
                async with post_stream(shared, endpoint, "/chat/completions", b"{}") as resp:
                    bodies.append(await resp.read(1024))
            return bodies, shared.connections_made
        finally:
            await shared.close()
            await runner.cleanup()

    bodies, made = uvloop.run(main())
    assert bodies == [b'data: {"n": 1}\n\ndata: [DONE]\n\n'] * 2
    assert made == 1
