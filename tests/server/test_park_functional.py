"""Rollouts that outlive a socket, and who may see them (PARK-1..PARK-6, OWN-1..OWN-3).

A real server with two API keys; the official SDK's ``responses.connect()`` as the client. The
first connection leaves a rollout suspended on a tool call and closes; a second connection of
the same key continues from that response and must resume the very same coroutine (one
rollout id, the history processed once). Another key must get not-found, never the data.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

from engine.core import EngineConfig
from engine.retained.parking import ParkingBounds
from engine.server.transport.server_config import ServerConfig
from tests.support.server import LiveServer
from tests.support.wait import wait_for

KEYS = ServerConfig(api_keys=frozenset({"key-alice", "key-bob"}))
TOOLS: list[Any] = [
    {"type": "function", "name": name, "parameters": {"type": "object", "properties": {}}}
    for name in ("list_dir", "read_file", "search", "edit_file", "run_tests")
]
MODEL = "sim-coding-agent"


@pytest.fixture
async def keyed(server_factory: Callable[..., Any]) -> LiveServer:
    live: LiveServer = await server_factory(EngineConfig(tokens_per_second=0), server=KEYS)
    return live


@pytest.fixture
async def clients(keyed: LiveServer) -> AsyncIterator[tuple[AsyncOpenAI, AsyncOpenAI]]:
    alice = AsyncOpenAI(base_url=keyed.base_url, api_key="key-alice", max_retries=0)
    bob = AsyncOpenAI(base_url=keyed.base_url, api_key="key-bob", max_retries=0)
    try:
        yield alice, bob
    finally:
        await alice.close()
        await bob.close()


async def _turn(conn: Any) -> Any:
    """Events of one create up to its terminal event (or an error event)."""
    async for event in conn:
        if event.type in ("response.completed", "error"):
            return event


def _answer(response: Any) -> list[Any]:
    call = response.output[-1]
    assert call.type == "function_call"
    return [{"type": "function_call_output", "call_id": call.call_id, "output": "ok"}]


async def _first_turn(client: AsyncOpenAI, store: bool) -> Any:
    """One connection: a create that ends suspended on a tool call; then the socket closes."""
    async with client.responses.connect() as conn:
        await conn.response.create(model=MODEL, input="Fix the tests.", tools=TOOLS, store=store)
        done = await _turn(conn)
    assert done.type == "response.completed"
    return done.response


async def _continue(client: AsyncOpenAI, response: Any, store: bool) -> Any:
    async with client.responses.connect() as conn:
        await conn.response.create(
            model=MODEL,
            previous_response_id=response.id,
            input=_answer(response),
            tools=TOOLS,
            store=store,
        )
        return await _turn(conn)


@pytest.mark.parametrize("store", [False, True])
async def test_parked_rollout_resumed_by_a_new_connection(
    keyed: LiveServer, clients: tuple[AsyncOpenAI, AsyncOpenAI], store: bool
) -> None:
    """PARK-1, PARK-3: the rollout waits; the owner's new connection resumes the same coroutine
    on the fast path, pre-inference only over the new items. ``store: false`` too: it stays
    local to this process, not to the closed connection (PARK-5)."""
    alice, _ = clients
    engine = keyed.engine
    first = await _first_turn(alice, store)
    await wait_for(lambda: len(engine.parking) == 1)
    second = await _continue(alice, first, store)
    assert second.type == "response.completed", second
    assert second.response.previous_response_id == first.id
    assert engine.counters["create.unparked"] == engine.counters["create.fast_path"] == 1
    assert engine.counters["park.parked"] == 2  # the second connection closed suspended too
    await wait_for(lambda: len(engine.parking) == 1)
    await keyed.runner.cleanup()  # shutdown retires what is parked and drains accounting
    records = list(engine.post.recent)
    assert [r.response_ids for r in records] == [[first.id], [second.response.id]]
    assert len({r.rollout_id for r in records}) == 1  # one coroutine served both responses
    assert sum(r.stage_runs.get("validate.full", 0) for r in records) == 1
    assert [r.stage_runs.get("validate.incremental", 0) for r in records] == [0, 1]


async def test_park_expiry_retires_the_rollout_and_accounts_once(
    server_factory: Callable[..., Any],
) -> None:
    """PARK-2: unclaimed, the parked rollout is retired when its time is up: it ends, its stage
    statistics are added once, no further usage record (its response was billed, POST-1), and
    the id is no longer continuable (``store: false``)."""
    config = EngineConfig(tokens_per_second=0, park_seconds=0.05)
    live: LiveServer = await server_factory(config)
    client = AsyncOpenAI(base_url=live.base_url, api_key="x", max_retries=0)
    engine = live.engine
    first = await _first_turn(client, store=False)
    await wait_for(lambda: engine.counters["park.expired"] == 1)
    await wait_for(lambda: engine.stats.runs["validate.full"] == 1)  # _finish ran: stats added
    assert len(engine.parking) == 0
    late = await _continue(client, first, store=False)
    assert late.type == "error" and late.error.code == "previous_response_not_found"
    await engine.post.stop()
    assert [r.response_ids for r in engine.post.recent] == [[first.id]]
    assert engine.stats.runs["validate.full"] == 1  # accounted exactly once
    await client.close()


async def test_another_key_gets_not_found_and_the_owner_still_resumes(
    keyed: LiveServer, clients: tuple[AsyncOpenAI, AsyncOpenAI]
) -> None:
    """OWN-2: another key's continuation is ``previous_response_not_found`` exactly as for an
    unknown id, and it disturbs nothing: the owner then resumes the parked rollout."""
    alice, bob = clients
    first = await _first_turn(alice, store=True)
    await wait_for(lambda: len(keyed.engine.parking) == 1)
    refused = await _continue(bob, first, store=True)
    assert refused.type == "error"
    assert (refused.error.code, refused.error.param) == (
        "previous_response_not_found",
        "previous_response_id",
    )
    assert first.id in refused.error.message  # the id it was given, nothing else
    resumed = await _continue(alice, first, store=True)
    assert resumed.type == "response.completed"
    assert keyed.engine.counters["create.unparked"] == 1


async def test_stored_responses_belong_to_their_key_over_http(
    keyed: LiveServer, clients: tuple[AsyncOpenAI, AsyncOpenAI]
) -> None:
    """OWN-2 over HTTP: retrieve, list input items, cancel, delete and continue are not-found
    for another key; the owner can do all of them."""
    alice, bob = clients
    made = await alice.responses.create(model=MODEL, input="Fix the tests.", tools=TOOLS)
    for attempt in (
        bob.responses.retrieve(made.id),
        bob.responses.input_items.list(made.id),
        bob.responses.cancel(made.id),
        bob.responses.delete(made.id),
    ):
        with pytest.raises(openai.NotFoundError) as info:
            await attempt
        assert info.value.code == "response_not_found"
    with pytest.raises(openai.BadRequestError) as refused:
        await bob.responses.create(
            model=MODEL, previous_response_id=made.id, input=_answer(made), tools=TOOLS
        )
    assert refused.value.code == "previous_response_not_found"
    assert (await alice.responses.retrieve(made.id)).id == made.id
    follow = await alice.responses.create(
        model=MODEL, previous_response_id=made.id, input=_answer(made), tools=TOOLS
    )
    assert follow.previous_response_id == made.id
    await alice.responses.delete(made.id)
    with pytest.raises(openai.NotFoundError):
        await alice.responses.retrieve(made.id)
    queued = await alice.responses.create(model=MODEL, input="Fix the tests.", background=True)
    with pytest.raises(openai.NotFoundError):  # a background response too, live or settled
        await bob.responses.retrieve(queued.id)
    assert (await alice.responses.retrieve(queued.id)).id == queued.id


async def test_the_lot_is_bounded_per_owner_and_retires_the_oldest(
    server_factory: Callable[..., Any],
) -> None:
    """PARK-7: past an owner's bound the oldest parked rollout is retired (and counted), newer
    ones stay parked and resumable; another owner's rollouts are not touched."""
    bounds = ParkingBounds(rollouts_per_owner=2)
    live: LiveServer = await server_factory(
        EngineConfig(tokens_per_second=0, park_bounds=bounds), server=KEYS
    )
    alice = AsyncOpenAI(base_url=live.base_url, api_key="key-alice", max_retries=0)
    bob = AsyncOpenAI(base_url=live.base_url, api_key="key-bob", max_retries=0)
    try:
        bobs = await _first_turn(bob, store=False)
        first = [await _first_turn(alice, store=False) for _ in range(3)]
        await wait_for(lambda: live.engine.counters["park.parked"] == 4)
        assert live.engine.counters["park.evicted"] == 1
        assert len(live.engine.parking) == 3
        # The oldest of alice's is gone (store: false: nothing else knows it), the newest resumes.
        gone = await _continue(alice, first[0], store=False)
        assert gone.type == "error" and gone.error.code == "previous_response_not_found"
        resumed = await _continue(alice, first[2], store=False)
        assert resumed.type == "response.completed"
        assert (await _continue(bob, bobs, store=False)).type == "response.completed"
        assert live.engine.counters["create.unparked"] == 2
    finally:
        await alice.close()
        await bob.close()


async def test_a_rollout_over_the_byte_bound_is_not_parked(
    server_factory: Callable[..., Any],
) -> None:
    """PARK-7: a rollout bigger than the lot's byte bound is retired at close, not parked."""
    bounds = ParkingBounds(nbytes_per_owner=100)
    live: LiveServer = await server_factory(
        EngineConfig(tokens_per_second=0, park_bounds=bounds), server=KEYS
    )
    alice = AsyncOpenAI(base_url=live.base_url, api_key="key-alice", max_retries=0)
    try:
        await _first_turn(alice, store=False)
        await wait_for(lambda: live.engine.counters["park.refused"] == 1)
        assert len(live.engine.parking) == 0 and live.engine.parking.nbytes == 0
    finally:
        await alice.close()


async def test_a_socket_closing_after_its_response_continued_elsewhere_does_not_park(
    server_factory: Callable[..., Any],
) -> None:
    """PARK-9: a stored response continued from the store while the connection that holds its
    suspended rollout is still open (to this process, a half-open socket whose client has
    already reconnected) leaves a notice; when that socket closes, the rollout is retired, not
    parked, so it cannot resume a second time. (The hydration cache is off, so the second
    connection's continuation takes the store path, as on another node.)"""
    config = EngineConfig(tokens_per_second=0, hydration_cache_bytes=0)
    live: LiveServer = await server_factory(config)
    client = AsyncOpenAI(base_url=live.base_url, api_key="x", max_retries=0)
    engine = live.engine
    try:
        async with client.responses.connect() as held:
            await held.response.create(model=MODEL, input="Fix the tests.", tools=TOOLS, store=True)
            first = (await _turn(held)).response
            moved = await _continue(client, first, store=True)
            assert moved.type == "response.completed", moved
            assert engine.counters["create.store_hydrate"] == 1
            assert engine.counters["park.notice_sent"] == 1
        await wait_for(lambda: engine.counters["park.continued_elsewhere"] == 1)
        # Parked: only the second connection's rollout (the coding agent calls tools again).
        assert len(engine.parking) == 1 and engine.counters["park.parked"] == 1
        again = await _continue(client, first, store=True)
        assert again.type == "response.completed", again
        assert engine.counters["create.unparked"] == 0  # the held copy did not resume
        assert engine.counters["create.store_hydrate"] == 2
    finally:
        await client.close()


async def test_a_draining_server_retires_what_it_parks(
    server_factory: Callable[..., Any],
) -> None:
    """PARK-10, LIM-13: at the start of the drain every parked rollout is retired (counted
    ``park.drained``) and accounted once; nothing can be resumed here any more."""
    live: LiveServer = await server_factory(EngineConfig(tokens_per_second=0))
    client = AsyncOpenAI(base_url=live.base_url, api_key="x", max_retries=0)
    engine = live.engine
    try:
        first = await _first_turn(client, store=False)
        await _first_turn(client, store=True)
        await wait_for(lambda: len(engine.parking) == 2)
    finally:
        await client.close()
    await live.runner.cleanup()
    assert engine.counters["park.drained"] == 2 and len(engine.parking) == 0
    assert engine.counters["park.expired"] == engine.counters["park.evicted"] == 0
    billed = [r.response_ids for r in engine.post.recent]
    assert len(billed) == 2 and billed[0] == [first.id]  # each once, nothing at retirement
