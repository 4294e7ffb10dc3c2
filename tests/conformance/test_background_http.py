"""Background responses over HTTP with the official ``openai`` SDK as client (BG-1..BG-9).

A scripted backend with gates (``asyncio.Event`` steps, MODEL-4) holds a run at a known point,
so each test observes a live run without depending on timing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

from engine.core import EngineConfig
from engine.models.base import TextDelta
from engine.models.router import Router
from engine.models.sim.scripted import ScriptedModel, ScriptStep
from engine.models.upstreams.endpoint import UpstreamError
from engine.server.transport.server_config import ServerConfig
from engine.store import chain_record
from protocol.response import Response
from tests.support.server import LiveServer
from tests.support.wait import wait_for


async def _client(live: LiveServer) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=live.base_url, api_key="x", max_retries=0)


@pytest.fixture
async def scripted(
    server_factory: Callable[..., Any],
) -> AsyncIterator[Callable[..., Any]]:
    """Start a server whose every model is a ScriptedModel with the given turns."""
    clients: list[AsyncOpenAI] = []

    async def make(
        turns: list[list[ScriptStep]], server: ServerConfig | None = None
    ) -> tuple[LiveServer, AsyncOpenAI]:
        router = Router(routes={}, default=ScriptedModel(turns))
        live = await server_factory(EngineConfig(tokens_per_second=0), router, server=server)
        client = await _client(live)
        clients.append(client)
        return live, client

    try:
        yield make
    finally:
        for client in clients:
            await client.close()


async def test_background_create_returns_queued_then_polls_to_completed(
    server: LiveServer,
) -> None:
    """BG-1, BG-3: the create answers at once (queued); polling reaches the terminal state,
    which is stored like any response."""
    client = await _client(server)
    try:
        first = await client.responses.create(model="sim", input="Say hi", background=True)
        assert first.background is True and first.status == "queued"

        async def finished() -> Any:
            response = await client.responses.retrieve(first.id)
            return response if response.status not in ("queued", "in_progress") else None

        response = await wait_for(finished, "the background response to finish")
        assert response.status == "completed" and response.background is True
        assert response.output_text.startswith("This is a simulated answer to: Say hi")
        assert response.usage is not None and response.usage.output_tokens > 0
    finally:
        await client.close()


async def test_stream_resumes_after_a_lost_connection_without_losing_an_event(
    scripted: Callable[..., Any],
) -> None:
    """BG-4, BG-5: replay from any sequence number, then follow; a reader that drops its SSE
    connection resumes with ``starting_after`` and sees every event exactly once."""
    gate1, gate2 = asyncio.Event(), asyncio.Event()
    turn: list[ScriptStep] = [TextDelta("Hello"), gate1, TextDelta(" world"), gate2, TextDelta("!")]
    _, client = await scripted([turn])
    created = await client.responses.create(model="m", input="hi", background=True)
    assert created.status == "queued"

    seen: list[Any] = []
    first = await client.responses.retrieve(created.id, stream=True)
    async for event in first:
        seen.append(event)
        if event.type == "response.output_text.delta":
            break
    await first.close()  # the connection is lost mid-response
    live = await client.responses.retrieve(created.id)
    assert live.status == "in_progress"  # opened at the first delta (ORD-1)

    gate1.set()  # " world" is produced while nobody is reading
    resumed = await client.responses.retrieve(
        created.id, stream=True, starting_after=seen[-1].sequence_number
    )
    async for event in resumed:
        seen.append(event)
        if event.type == "response.output_text.delta" and event.delta == " world":
            gate2.set()
    numbers = [event.sequence_number for event in seen]
    assert numbers == list(range(len(seen))), numbers  # no gap, no repeat (ORD-3)
    assert seen[0].type == "response.created" and seen[-1].type == "response.completed"
    deltas = [e.delta for e in seen if e.type == "response.output_text.delta"]
    assert deltas == ["Hello", " world", "!"]
    assert seen[-1].response.output_text == "Hello world!"

    # A replay from the middle, after the end, gives exactly the tail.
    tail = await client.responses.retrieve(created.id, stream=True, starting_after=numbers[-3])
    assert [e.sequence_number async for e in tail] == numbers[-2:]


async def test_create_with_stream_true_follows_the_run(server: LiveServer) -> None:
    """BG-2: ``background`` with ``stream`` streams the run from its first event."""
    client = await _client(server)
    try:
        stream = await client.responses.create(
            model="sim", input="Say hi", background=True, stream=True
        )
        events = [event async for event in stream]
        assert events[0].type == "response.created" and events[-1].type == "response.completed"
        assert events[-1].response.background is True
        stored = await client.responses.retrieve(events[-1].response.id)
        assert stored.status == "completed"
    finally:
        await client.close()


async def test_cancel_ends_the_run_cancelled_stored_and_billed(
    scripted: Callable[..., Any],
) -> None:
    """BG-6: cancel cancels the coroutine; the response ends ``cancelled``, is stored with its
    usage, and a usage record is written. A reader's stream ends."""
    never = asyncio.Event()
    live, client = await scripted([[TextDelta("partial"), never, TextDelta("never sent")]])
    created = await client.responses.create(model="m", input="hi", background=True)
    stream = await client.responses.retrieve(created.id, stream=True)
    types: list[str] = []
    async for event in stream:
        types.append(event.type)
        if event.type == "response.output_text.delta":
            break

    cancelled = await client.responses.cancel(created.id)
    assert cancelled.status == "cancelled" and cancelled.background is True
    assert cancelled.usage is not None and cancelled.usage.input_tokens > 0
    rest = [event.type async for event in stream]
    assert "response.output_text.delta" not in rest  # nothing after the cancel
    stored = await client.responses.retrieve(created.id)
    assert stored.status == "cancelled"
    # the record is accounted by the post-inference worker (POST-2)
    records = await wait_for(lambda: live.engine.post.records_for(created.id), "its usage record")
    assert [record.status for record in records] == ["cancelled"]
    again = await client.responses.cancel(created.id)  # idempotent once finished
    assert again.status == "cancelled"


async def test_a_cancel_before_the_first_delta_answers_cancelled(
    scripted: Callable[..., Any],
) -> None:
    """BG-6 (found by LIVE-7's walk): a run cancelled before the model's first delta opened
    the response answers ``cancelled``, as its stored record says, never ``queued``."""
    never = asyncio.Event()
    _live, client = await scripted([[never, TextDelta("never sent")]])
    created = await client.responses.create(model="m", input="hi", background=True)
    cancelled = await client.responses.cancel(created.id)
    assert cancelled.status == "cancelled", cancelled
    assert (await client.responses.retrieve(created.id)).status == "cancelled"


async def test_cancel_refusals(server: LiveServer) -> None:
    """BG-6: only background responses are cancellable; unknown ids are 404."""
    client = await _client(server)
    try:
        plain = await client.responses.create(model="sim", input="hi")
        with pytest.raises(openai.BadRequestError) as refused:
            await client.responses.cancel(plain.id)
        assert refused.value.code == "response_not_cancellable"
        with pytest.raises(openai.NotFoundError):
            await client.responses.cancel("resp_unknown")
    finally:
        await client.close()


async def test_background_requires_store(server: LiveServer) -> None:
    """BG-1: ``background`` with ``store: false`` is a 400 before anything runs."""
    client = await _client(server)
    try:
        with pytest.raises(openai.BadRequestError) as refused:
            await client.responses.create(model="sim", input="hi", background=True, store=False)
        assert refused.value.code == "invalid_value" and refused.value.param == "store"
        with pytest.raises(openai.BadRequestError) as missing:
            await client.responses.create(
                model="sim", input="hi", background=True, previous_response_id="resp_nope"
            )
        assert missing.value.code == "previous_response_not_found"  # admission errors stay 400
    finally:
        await client.close()


async def test_continuing_an_unfinished_background_response_is_refused(
    scripted: Callable[..., Any],
) -> None:
    """BG-7: a background response can be continued once it has finished."""
    gate = asyncio.Event()
    live, client = await scripted([[TextDelta("a"), gate], [TextDelta("b")]])
    created = await client.responses.create(model="m", input="hi", background=True)
    admitted = await live.engine.store.hydrate(created.id)  # written at admission, with context
    assert admitted is not None and admitted.record.response.status == "queued"
    assert [type(item).__name__ for item in admitted.items] == ["Message"]
    with pytest.raises(openai.BadRequestError) as refused:
        await client.responses.create(model="m", input="more", previous_response_id=created.id)
    assert refused.value.code == "previous_response_in_progress"
    gate.set()
    stream = await client.responses.retrieve(created.id, stream=True)
    assert [e.type async for e in stream][-1] == "response.completed"
    follow_up = await client.responses.create(
        model="m", input="more", previous_response_id=created.id
    )
    assert follow_up.output_text == "b"


async def test_an_orphaned_in_progress_record_is_settled_failed_on_read(
    server_factory: Callable[..., Any],
) -> None:
    """BG-8: a stored background response left in_progress by a process that is gone (here: a
    record written as a crashed process would have left it) is reported ``failed``, and the
    settled record is written back."""
    live = await server_factory(EngineConfig(tokens_per_second=0, background_orphan_after_s=60))
    old = Response(
        id="resp_orphan",
        created_at=int(time.time()) - 120,
        model="sim",
        status="in_progress",
        background=True,
    )
    young = Response(
        id="resp_young", created_at=int(time.time()), model="sim", status="in_progress",
        background=True,
    )  # fmt: skip
    for response in (old, young):
        await live.engine.store.put(chain_record(response, [], [], None))
    client = await _client(live)
    try:
        settled = await client.responses.retrieve("resp_orphan")
        assert settled.status == "failed" and settled.error is not None
        assert settled.error.code == "server_error"
        record = await live.engine.store.get("resp_orphan")
        assert record is not None and record.response.status == "failed"
        # Younger than any run can last: possibly another process's run, left as it is.
        assert (await client.responses.retrieve("resp_young")).status == "in_progress"
        with pytest.raises(openai.BadRequestError) as elsewhere:
            await client.responses.cancel("resp_young")
        assert elsewhere.value.code == "response_not_cancellable"
    finally:
        await client.close()


async def test_shutdown_cancels_a_run_that_outlives_the_grace(
    scripted: Callable[..., Any],
) -> None:
    """BG-6, LIM-13: a run still going when the grace period ends is cancelled and stored
    ``cancelled``; nothing stays in_progress."""
    never = asyncio.Event()
    grace = ServerConfig(shutdown_grace_s=0.05)
    live, client = await scripted([[TextDelta("a"), never]], server=grace)
    created = await client.responses.create(model="m", input="hi", background=True)
    await live.runner.cleanup()
    record = await live.engine.store.get(created.id)
    assert record is not None and record.response.status == "cancelled"


async def test_delete_cancels_a_running_background_response(
    scripted: Callable[..., Any],
) -> None:
    """BG-9: deleting a running background response cancels it; no record reappears."""
    never = asyncio.Event()
    live, client = await scripted([[TextDelta("a"), never]])
    created = await client.responses.create(model="m", input="hi", background=True)
    await client.responses.delete(created.id)
    assert await live.engine.store.get(created.id) is None
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(created.id)


async def test_a_refused_run_is_stored_failed(scripted: Callable[..., Any]) -> None:
    """BG-7: a backend refusal (MODEL-5) after the create was answered leaves no response
    events; the stored response ends ``failed`` with the refusal's message, never queued."""
    refusal = UpstreamError("The upstream refused the request.", 400)
    _, client = await scripted([[refusal]])
    created = await client.responses.create(model="m", input="hi", background=True)
    stream = await client.responses.retrieve(created.id, stream=True)
    assert [event async for event in stream] == []  # the run ended without a response event
    failed = await client.responses.retrieve(created.id)
    assert failed.status == "failed" and failed.error is not None
    assert failed.error.code == "server_error" and "refused" in failed.error.message
