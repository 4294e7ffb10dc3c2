"""WebSocket-mode conformance: ``client.responses.connect()`` of the official ``openai`` SDK (3.51).

Every frame a test receives is validated strictly with the SDK's ``ResponsesServerEvent`` union
(pydantic), not only constructed loosely as the SDK connection does. Rules checked come from
PROTOCOL.md §2 (client events), §3 (server events, the WS ``error`` shape), §4 (ordering), §7
(connection cache, eviction, lanes, queueing) and §11 (leniency); each test's docstring names
the SPEC.md rules it checks.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI
from openai.lib.responses_websocket import (
    AsyncResponsesWebSocketSession,
    ResponsesWebSocketLimits,
)
from openai.types.responses import Response
from websockets.exceptions import InvalidStatus

from engine.core import EngineConfig
from engine.server.transport.server_config import ServerConfig
from tests.conformance.sdk_ws import (
    EVENTS,
    INTERNAL,
    MODEL,
    RECV_TIMEOUT,
    TERMINAL,
    call_output,
    check_error,
    check_response_events,
    create,
    final,
    recv,
    until_done,
)
from tests.support.server import LiveServer
from tests.support.tools import WEATHER
from tests.support.wait import wait_for

# ----------------------------------------------------------------------------- helpers


# ----------------------------------------------------------------------------- basic creates


async def test_ws_single_create_full_event_sequence(client: AsyncOpenAI) -> None:
    """WS-1, ORD-1, ORD-5, ORD-7, WS-7 (default lane: no ``stream_id``)."""
    async with client.responses.connect() as conn:
        events = await create(conn, input="Say hi", store=False)
    check_response_events(events)
    types = [e.type for e in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert all("stream_id" not in e.model_fields_set for e in events)  # default lane: absent
    response = final(events)
    assert response.status == "completed"
    assert response.output_text == "This is a simulated answer to: Say hi"
    assert response.store is False
    assert response.usage is not None and response.usage.output_tokens > 0


async def test_ws_sequential_creates_on_one_socket(client: AsyncOpenAI) -> None:
    """WS-5, ORD-3: per-response counters on one socket."""
    async with client.responses.connect() as conn:
        runs = [await create(conn, input=f"Question {n}", store=False) for n in range(3)]
    for n, events in enumerate(runs):
        check_response_events(events)  # sequence numbers restart at 0 per response
        assert final(events).output_text == f"This is a simulated answer to: Question {n}"
    assert len({final(events).id for events in runs}) == 3


async def test_ws_store_false_continuation_hits_connection_cache(
    client: AsyncOpenAI, server: LiveServer
) -> None:
    """CACHE-1, COMPAT-3: a store=false text turn is continued from the lane cache."""
    async with client.responses.connect() as conn:
        first = final(await create(conn, input="First turn", store=False))
        events = await create(
            conn,
            previous_response_id=first.id,
            input=[{"role": "user", "content": "Second turn"}],
            store=False,
        )
    second = final(events)
    assert second.previous_response_id == first.id
    assert second.output_text == "This is a simulated answer to: Second turn"
    assert server.engine.counters["create.cache_hit"] == 1
    assert server.engine.counters["create.store_hydrate"] == 0
    assert second.usage is not None and second.usage.input_tokens_details.cached_tokens > 0


async def test_ws_tool_round_trip_resumes_rollout_on_fast_path(
    client: AsyncOpenAI, server: LiveServer
) -> None:
    """COMPAT-1, COMPAT-2, ROLL-2, POST-3: one coroutine serves both responses, and the
    second one only validates the new items."""
    async with client.responses.connect() as conn:
        first = final(await create(conn, input="Weather in Paris?", tools=[WEATHER], store=False))
        call = first.output[0]
        assert first.status == "completed"
        assert call.type == "function_call" and call.name == "get_weather"
        assert call.arguments == '{"city":"Paris"}'
        events = await create(
            conn,
            previous_response_id=first.id,
            input=[call_output(call.call_id, "sunny")],
            tools=[WEATHER],
            store=False,
        )
    check_response_events(events)
    second = final(events)
    assert second.id != first.id
    assert second.output_text == "Based on the tool results: sunny"
    counters = server.engine.counters
    assert counters["create.fast_path"] == 1
    assert counters["create.stateless"] == 1
    assert counters["create.cache_hit"] == counters["create.cache_miss"] == 0
    first_record = await _ledger_record(server, first.id)
    second_record = await _ledger_record(server, second.id)
    assert first_record.rollout_id == second_record.rollout_id  # one coroutine, both responses
    assert first_record.stage_runs.get("validate.full") == 1
    assert "validate.full" not in second_record.stage_runs  # only the new items were processed
    assert second_record.stage_runs.get("validate.incremental", 0) >= 1


async def _ledger_record(server: LiveServer, response_id: str) -> Any:
    records = await wait_for(
        lambda: server.engine.post.records_for(response_id), f"a usage record for {response_id}"
    )
    assert isinstance(records, list)
    return records[-1]


async def test_ws_parallel_tool_calls(client: AsyncOpenAI) -> None:
    """SIM-3, ORD-4: several calls in one response, answered together."""
    time_tool = {**WEATHER, "name": "get_time"}
    async with client.responses.connect() as conn:
        events = await create(
            conn,
            input="Use get_weather and get_time for Tokyo",
            tools=[WEATHER, time_tool],
            parallel_tool_calls=True,
            store=False,
        )
        first = final(events)
        calls = first.output
        assert [c.name for c in calls] == ["get_weather", "get_time"]
        added = [e.output_index for e in events if e.type == "response.output_item.added"]
        assert added == [0, 1]
        events = await create(
            conn,
            previous_response_id=first.id,
            input=[call_output(calls[0].call_id, "rain"), call_output(calls[1].call_id, "noon")],
            tools=[WEATHER, time_tool],
            store=False,
        )
    assert final(events).output_text == "Based on the tool results: rain; noon"


# ----------------------------------------------------------------------------- queueing


async def test_ws_create_while_running_is_queued_fifo(server_factory: Any) -> None:
    """WS-5: a create sent while another runs is queued, never interleaved."""
    server: LiveServer = await server_factory(EngineConfig(tokens_per_second=400))
    sdk = AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    async with sdk.responses.connect() as conn:
        await conn.response.create(model=MODEL, input="Alpha question here", store=False)
        await conn.response.create(model=MODEL, input="Beta question here", store=False)
        first = await until_done(conn)
        second = await until_done(conn)
    await sdk.close()
    check_response_events(first)  # no interleaving: A's events all precede B's created
    check_response_events(second)
    assert final(first).output_text.endswith("Alpha question here")
    assert final(second).output_text.endswith("Beta question here")


async def test_ws_lane_queue_overflow_is_429(server_factory: Any) -> None:
    """WS-6, LIM-2: a lane holds the running create plus ``max_queued_creates`` waiting ones;
    one more is rejected with 429 ``websocket_queue_full``; the accepted ones all complete."""
    server: LiveServer = await server_factory(
        EngineConfig(tokens_per_second=200, max_queued_creates=1)
    )
    sdk = AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    async with sdk.responses.connect() as conn:
        for n in range(4):
            await conn.response.create(model=MODEL, input=f"Request number {n}", store=False)
        completed: list[str] = []
        errors: list[Any] = []
        while len(completed) + len(errors) < 4:
            event = await recv(conn)
            if event.type == "error":
                errors.append(event)
            elif event.type in TERMINAL:
                completed.append(event.response.output_text)
    await sdk.close()
    assert errors, "no create was rejected"
    for error in errors:
        check_error(error, "websocket_queue_full", 429)
        assert error.error.type == "rate_limit_error"
    assert completed == sorted(completed)  # FIFO among the accepted ones
    assert completed[0].endswith("Request number 0")


async def test_ws_queued_bytes_per_connection_are_bounded(server_factory: Any) -> None:
    """LIM-22: the creates waiting across a connection's lanes hold at most
    ``max_queued_bytes`` of frames; one more is 429 ``websocket_queue_full``, the socket stays
    open, and the accepted ones complete in order on their lanes."""
    server: LiveServer = await server_factory(
        EngineConfig(tokens_per_second=200, max_queued_bytes=150_000)
    )
    sdk = AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    padding = "p" * 60_000  # each create's frame is about 60 KB
    async with sdk.responses.connect() as conn:
        # The first create on each lane runs at once (not queued); the next ones wait.
        for n in range(6):
            lane = f"lane-{n % 2}"
            await conn.response.create(
                model=MODEL,
                input=f"Request {n}",
                instructions=padding,
                store=False,
                stream_id=lane,
            )
        completed, errors = 0, list[Any]()
        while completed + len(errors) < 6:
            event = await recv(conn)
            if event.type == "error":
                errors.append(event)
            elif event.type in TERMINAL:
                completed += 1
        after = await create(conn, input="Still alive?", store=False)
    await sdk.close()
    assert errors, "no create was rejected"
    for error in errors:
        check_error(error, "websocket_queue_full", 429)
        assert "bytes" in error.error.message
    assert final(after).status == "completed"


# ----------------------------------------------------------------------------- errors


async def test_ws_previous_response_not_found_error_keeps_socket_open(client: AsyncOpenAI) -> None:
    """COMPAT-4, ERR-1, ERR-4, EV-3, ORD-1."""
    async with client.responses.connect() as conn:
        events = await create(conn, previous_response_id="resp_unknown", input="hi", store=False)
        assert len(events) == 1  # no response.created for a rejected request (§4.1 #9)
        error = events[0]
        check_error(error, "previous_response_not_found", 400, "previous_response_id")
        assert error.error.type == "invalid_request_error"
        assert "resp_unknown" in error.error.message
        assert error.sequence_number is None and error.stream_id is None
        after = await create(conn, input="Still alive?", store=False)
    assert final(after).status == "completed"


async def test_ws_failed_continuation_evicts_parent(
    client: AsyncOpenAI, server: LiveServer
) -> None:
    """CACHE-3: after a failed continuation the parent is gone (store=false)."""
    async with client.responses.connect() as conn:
        first = final(await create(conn, input="Weather in Oslo?", tools=[WEATHER], store=False))
        call = first.output[0]
        bad = await create(
            conn,
            previous_response_id=first.id,
            input=[call_output("call_not_issued", "x")],
            tools=[WEATHER],
            store=False,
        )
        assert len(bad) == 1
        check_error(bad[0], bad[0].error.code or "", 400)
        assert bad[0].error.code in ("tool_output_missing", "unknown_call_id")
        assert server.engine.counters["cache.evicted"] == 1
        retry = await create(
            conn,
            previous_response_id=first.id,
            input=[call_output(call.call_id, "cold")],
            tools=[WEATHER],
            store=False,
        )
        check_error(retry[0], "previous_response_not_found", 400, "previous_response_id")
        fresh = await create(conn, input="New chain", store=False)
    assert final(fresh).status == "completed"


async def test_ws_store_false_state_is_connection_local(client: AsyncOpenAI) -> None:
    """STORE-1, WS-12: the cache dies with its connection."""
    async with client.responses.connect() as conn:
        first = final(await create(conn, input="Remember me", store=False))
    async with client.responses.connect() as conn:
        events = await create(conn, previous_response_id=first.id, input="again", store=False)
    check_error(events[0], "previous_response_not_found", 400, "previous_response_id")


async def test_ws_store_true_cache_miss_hydrates_from_store(
    server_factory: Callable[..., Any],
) -> None:
    """COMPAT-4 over WebSocket: with parking (PARK-1) and the hydration cache (HYD-1) off, a new
    connection's continuation is served from the store."""
    config = EngineConfig(tokens_per_second=0, park_seconds=0, hydration_cache_bytes=0)
    server: LiveServer = await server_factory(config)
    client = AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    async with client.responses.connect() as conn:
        first = final(await create(conn, input="Weather in Rome?", tools=[WEATHER]))
    call = first.output[0]
    async with client.responses.connect() as conn:
        events = await create(
            conn,
            previous_response_id=first.id,
            input=[call_output(call.call_id, "hot")],
            tools=[WEATHER],
        )
    assert final(events).output_text == "Based on the tool results: hot"
    assert server.engine.counters["create.cache_miss"] == 1
    assert server.engine.counters["create.store_hydrate"] == 1
    await client.close()


async def test_ws_new_connection_resumes_parked_rollout(
    client: AsyncOpenAI, server: LiveServer
) -> None:
    """PARK-1, PARK-3: the same continuation with the defaults resumes the parked coroutine."""
    async with client.responses.connect() as conn:
        first = final(await create(conn, input="Weather in Rome?", tools=[WEATHER]))
    await wait_for(lambda: server.engine.counters["park.parked"] == 1)
    call = first.output[0]
    async with client.responses.connect() as conn:
        events = await create(
            conn,
            previous_response_id=first.id,
            input=[call_output(call.call_id, "hot")],
            tools=[WEATHER],
        )
    assert final(events).output_text == "Based on the tool results: hot"
    counters = server.engine.counters
    assert counters["create.unparked"] == counters["create.fast_path"] == 1
    assert counters["create.store_hydrate"] == 0


async def test_ws_background_true_rejected_with_error_event(client: AsyncOpenAI) -> None:
    """WS-10, LEN-3."""
    async with client.responses.connect() as conn:
        events = await create(conn, input="bg", background=True, store=False)
        check_error(events[0], "unsupported_parameter", 400, "background")
        assert final(await create(conn, input="after", store=False)).status == "completed"


MALFORMED: list[tuple[str, str | bytes]] = [
    ("invalid_json", "{this is not json"),
    ("binary_frame", json.dumps({"type": "response.create", "model": MODEL}).encode()),
    ("unknown_event_type", json.dumps({"type": "response.cancel"})),
    ("missing_type", json.dumps({"model": MODEL, "input": "hi"})),
    ("wrong_field_type", json.dumps({"type": "response.create", "model": MODEL, "input": 5})),
    ("wrong_nested_type", json.dumps({"type": "response.create", "tools": [{"type": 1}]})),
    ("not_an_object", json.dumps(["response.create"])),
    ("bad_input_item", json.dumps({"type": "response.create", "input": [{"type": "nope"}]})),
]


@pytest.mark.parametrize(("case", "frame"), MALFORMED, ids=[c for c, _ in MALFORMED])
async def test_ws_malformed_frame_gets_error_event_and_socket_stays_open(
    server: LiveServer, case: str, frame: str | bytes
) -> None:
    """WS-3, CODEC-2, CODEC-3, ERR-1, ERR-3, ERR-4."""
    async with aiohttp.ClientSession() as http, http.ws_connect(server.ws_url) as ws:
        if isinstance(frame, bytes):
            await ws.send_bytes(frame)
        else:
            await ws.send_str(frame)
        reply = await ws.receive(timeout=RECV_TIMEOUT)
        assert reply.type is aiohttp.WSMsgType.TEXT
        raw = json.loads(reply.data)
        event = EVENTS.validate_python(raw)
        check_error(event, raw["error"]["code"])
        assert isinstance(raw["error"]["code"], str) and raw["error"]["code"]
        assert 400 <= raw["status"] < 500
        assert not INTERNAL.search(reply.data)
        await ws.send_str(json.dumps({"type": "response.create", "model": MODEL, "input": "ok"}))
        types: list[str] = []
        while not types or types[-1] not in TERMINAL:
            msg = await ws.receive(timeout=RECV_TIMEOUT)
            types.append(EVENTS.validate_python(json.loads(msg.data)).type)
        assert types[0] == "response.created" and types[-1] == "response.completed"


async def test_ws_invalid_frames_through_sdk_send_raw(client: AsyncOpenAI) -> None:
    """The same leniency seen through the SDK connection's own raw send."""
    async with client.responses.connect() as conn:
        await conn.send_raw("not json at all")
        check_error(await recv(conn), "invalid_json", 400)
        await conn.send({"type": "response.unknown_thing"})
        unknown = await recv(conn)
        check_error(unknown, "unknown_event_type", 400, "type")
        await conn.send_raw(b'{"type":"response.create","model":"gpt-x","input":"bin"}')
        binary = await recv(conn)
        assert binary.type == "error" and isinstance(binary.status, int)
        assert final(await create(conn, input="works", store=False)).status == "completed"


# ----------------------------------------------------------------------------- warmup


async def test_ws_warmup_generate_false_then_continue(
    client: AsyncOpenAI, server: LiveServer
) -> None:
    """WS-9, ORD-1: warmup, then continue from its id."""
    async with client.responses.connect() as conn:
        events = await create(
            conn,
            input="Warm question",
            instructions="Be brief.",
            tools=[],
            store=False,
            generate=False,
        )
        assert [e.type for e in events] == ["response.created", "response.completed"]
        assert [e.sequence_number for e in events] == [0, 1]
        warm = final(events)
        assert warm.status == "completed" and warm.output == []
        assert warm.usage is not None
        assert warm.usage.output_tokens == 0 and warm.usage.input_tokens > 0
        follow = await create(
            conn, previous_response_id=warm.id, input=[], instructions="Be brief.", store=False
        )
    check_response_events(follow)
    answer = final(follow)
    assert answer.previous_response_id == warm.id
    assert answer.output_text == "This is a simulated answer to: Warm question"
    assert server.engine.counters["create.cache_hit"] == 1


async def test_ws_warmup_answering_pending_calls_then_continue(
    client: AsyncOpenAI, server: LiveServer
) -> None:
    """WS-9 with previous_response_id at a suspended rollout: the warmup commits the tool
    output without sampling; the next create generates from it (SPEC §15 item 13)."""
    async with client.responses.connect() as conn:
        first = final(await create(conn, input="Weather in Oslo?", tools=[WEATHER], store=False))
        call = first.output[0]
        warm_events = await create(
            conn,
            previous_response_id=first.id,
            input=[call_output(call.call_id, "cold")],
            tools=[WEATHER],
            store=False,
            generate=False,
        )
        assert [e.type for e in warm_events] == ["response.created", "response.completed"]
        warm = final(warm_events)
        assert warm.output == [] and warm.usage is not None and warm.usage.output_tokens == 0
        follow = final(
            await create(conn, previous_response_id=warm.id, input=[], tools=[WEATHER], store=False)
        )
    assert follow.output_text == "Based on the tool results: cold"
    assert server.engine.counters["create.fast_path"] == 0  # warmups never resume a rollout


# ----------------------------------------------------------------------------- leniency


async def test_ws_tolerated_fields_accepted_and_ignored(client: AsyncOpenAI) -> None:
    """WS-10, LEN-1, LEN-2."""
    async with client.responses.connect() as conn:
        events = await create(
            conn,
            input="Tolerant",
            store=False,
            stream=True,
            background=False,
            include=["reasoning.encrypted_content"],
            prompt_cache_key="cache-key-1",
            stream_options={"include_obfuscation": False},
        )
        check_response_events(events)
        assert final(events).output_text == "This is a simulated answer to: Tolerant"
        await conn.send_raw(
            json.dumps(
                {
                    "type": "response.create",
                    "model": MODEL,
                    "input": "Tolerant",
                    "store": False,
                    "client_metadata": {"trace": "abc"},
                    "some_future_field": {"nested": [1, 2]},
                    "metadata": {"k": "v"},
                }
            )
        )
        events = await until_done(conn)
    check_response_events(events)
    response = final(events)
    assert response.status == "completed"
    assert response.output_text == "This is a simulated answer to: Tolerant"


async def test_ws_agents_sdk_shaped_request_accepted(client: AsyncOpenAI) -> None:
    """The exact shape the Agents SDK sends (§9.2): easy-form messages, include [], stream."""
    async with client.responses.connect() as conn:
        await conn.send(
            {
                "type": "response.create",
                "instructions": "be nice",
                "model": MODEL,
                "input": [{"content": "weather in Paris?", "role": "user"}],
                "include": [],
                "tools": [WEATHER],
                "stream": True,
            }
        )
        events = await until_done(conn)
    call = final(events).output[0]
    assert call.type == "function_call" and call.arguments == '{"city":"Paris"}'


# ----------------------------------------------------------------------------- lanes


async def test_ws_stream_id_echoed_on_every_event(client: AsyncOpenAI) -> None:
    """WS-7, COMPAT-4: lane events and lane errors carry ``stream_id``."""
    async with client.responses.connect() as conn:
        events = await create(conn, input="Lane talk", store=False, stream_id="main")
        check_response_events(events)
        assert all(e.stream_id == "main" for e in events)
        errors = await create(
            conn,
            input="x",
            previous_response_id="resp_missing",
            store=False,
            stream_id="main",
        )
    check_error(errors[0], "previous_response_not_found", 400, "previous_response_id")
    assert errors[0].stream_id == "main"  # request-scoped errors name their lane


@pytest.mark.parametrize("stream_id", ["", "has space", "x" * 257, "slash/no", "é"])
async def test_ws_invalid_stream_id_error(client: AsyncOpenAI, stream_id: str) -> None:
    """WS-4: invalid ids are rejected and not echoed."""
    async with client.responses.connect() as conn:
        events = await create(conn, input="x", store=False, stream_id=stream_id)
        check_error(events[0], "invalid_stream_id", 400, "stream_id")
        assert events[0].stream_id is None  # the invalid value is not echoed
        assert final(await create(conn, input="ok", store=False)).status == "completed"


async def test_ws_lanes_run_concurrently_with_own_caches(server_factory: Any) -> None:
    """Two named lanes through the SDK's own lane router; each continues its own chain."""
    server: LiveServer = await server_factory(EngineConfig(tokens_per_second=500))
    sdk = AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    limits = ResponsesWebSocketLimits(
        max_lanes=4,
        max_events_per_lane=4096,
        max_events=8192,
        max_bytes_per_lane=1 << 24,
        max_bytes=1 << 25,
    )
    async with (
        sdk.responses.connect() as conn,
        AsyncResponsesWebSocketSession(conn, limits=limits) as session,
    ):
        lanes = {name: session.lane(name) for name in ("left", "right")}

        async def chain(name: str) -> tuple[Response, Response]:
            lane = lanes[name]
            await lane.send(
                {
                    "type": "response.create",
                    "model": MODEL,
                    "input": f"Start {name}",
                    "store": False,
                }
            )
            one = await lane.get_final_response()
            await lane.send(
                {
                    "type": "response.create",
                    "model": MODEL,
                    "previous_response_id": one.id,
                    "input": f"Next {name}",
                    "store": False,
                }
            )
            return one, await lane.get_final_response()

        results = await asyncio.gather(chain("left"), chain("right"))
    await sdk.close()
    for name, (one, two) in zip(("left", "right"), results, strict=True):
        assert one.output_text == f"This is a simulated answer to: Start {name}"
        assert two.output_text == f"This is a simulated answer to: Next {name}"
        assert two.previous_response_id == one.id
    assert server.engine.counters["create.cache_hit"] == 2


async def test_ws_stream_limit_reached(server_factory: Any) -> None:
    """WS-4, LIM-3."""
    server: LiveServer = await server_factory(EngineConfig(tokens_per_second=0, max_lanes=2))
    sdk = AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    async with sdk.responses.connect() as conn:
        for name in ("a", "b"):
            done = await create(conn, input="x", store=False, stream_id=name)
            assert final(done).status == "completed"
        over = await create(conn, input="x", store=False, stream_id="c")
        check_error(over[0], "websocket_stream_limit_reached", 400, "stream_id")
        assert over[0].stream_id == "c"
        again = await create(conn, input="x", store=False, stream_id="a")
    await sdk.close()
    assert final(again).status == "completed"


async def test_ws_fork_across_lanes_from_connection_cache(
    client: AsyncOpenAI, server: LiveServer
) -> None:
    """PROTOCOL §7.5 (forks): another lane's cached response, store=false, continued on a new
    lane; the source lane keeps its own entry and continues too."""
    async with client.responses.connect() as conn:
        parent = final(await create(conn, input="Main start", store=False, stream_id="main"))
        fork_events = await create(
            conn,
            input="Critic view",
            previous_response_id=parent.id,
            store=False,
            stream_id="critic",
        )
        check_response_events(fork_events)
        assert all(e.stream_id == "critic" for e in fork_events)
        fork = final(fork_events)
        main = final(
            await create(
                conn,
                input="Main next",
                previous_response_id=parent.id,
                store=False,
                stream_id="main",
            )
        )
    assert fork.previous_response_id == parent.id
    assert fork.output_text == "This is a simulated answer to: Critic view"
    assert main.output_text == "This is a simulated answer to: Main next"
    assert server.engine.counters["create.store_hydrate"] == 0


async def test_ws_failed_fork_does_not_evict_source_lane_parent(
    client: AsyncOpenAI, server: LiveServer
) -> None:
    """§7.3: a failing cross-lane request leaves the source lane's cached parent alone."""
    async with client.responses.connect() as conn:
        parent = final(await create(conn, input="Main start", store=False, stream_id="main"))
        await create(
            conn,
            input=[call_output("call_unknown", "x")],
            previous_response_id=parent.id,
            store=False,
            stream_id="critic",
        )
        main = await create(
            conn, input="Main next", previous_response_id=parent.id, store=False, stream_id="main"
        )
    assert final(main).output_text == "This is a simulated answer to: Main next"
    assert server.engine.counters["cache.evicted"] == 0


async def test_ws_pending_call_without_output_is_tool_output_missing(client: AsyncOpenAI) -> None:
    """VAL-5 on the fast path."""
    async with client.responses.connect() as conn:
        first = final(await create(conn, input="Weather in Nice?", tools=[WEATHER], store=False))
        events = await create(
            conn,
            previous_response_id=first.id,
            input=[{"role": "user", "content": "never mind"}],
            tools=[WEATHER],
            store=False,
        )
    check_error(events[0], "tool_output_missing", 400)
    assert first.output[0].call_id in events[0].error.message


async def _age_limited_create(server_factory: Any, **params: Any) -> Any:
    server: LiveServer = await server_factory(
        EngineConfig(tokens_per_second=0, max_connection_age_s=0.0)
    )
    sdk = AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    async with sdk.responses.connect() as conn:
        await asyncio.sleep(0.01)  # time itself: the connection outlives its 0 s age
        events = await create(conn, input="too late", store=False, **params)
    await sdk.close()
    assert len(events) == 1
    check_error(events[0], "websocket_connection_limit_reached", 400)
    assert "Create a new websocket connection" in events[0].error.message
    return events[0]


async def test_ws_connection_age_limit_reached(server_factory: Any) -> None:
    """WS-8, LIM-1: default lane, null param."""
    error = await _age_limited_create(server_factory)
    assert error.error.param is None and error.stream_id is None  # §3.2: no param


async def test_ws_connection_age_limit_error_is_connection_level(server_factory: Any) -> None:
    """WS-8, PROTOCOL §3.2: a connection-level error names no lane, even for a lane's create."""
    error = await _age_limited_create(server_factory, stream_id="main")
    assert error.error.param is None and error.stream_id is None


async def test_ws_steer_of_a_finished_response_fails(client: AsyncOpenAI) -> None:
    """PROTOCOL §2.2, §3.3, STEER-7: steering a response that already completed (and waits for
    nothing) is ``response.steer.failed`` (``response_already_completed``), returning the
    uncommitted input; the connection stays usable."""
    async with client.responses.connect() as conn:
        done = final(await create(conn, input="Plan a project", store=False))
        await conn.response.steer(previous_response_id=done.id, input="Keep it small.")
        event = await recv(conn)
        assert event.type == "response.steer.failed", event
        assert event.error.code == "response_already_completed"
        assert event.sequence_number == 0 and event.stream_id is None and event.steer.id is None
        assert event.error.type == "invalid_request_error"
        assert event.steer.previous_response_id == done.id
        assert event.steer.input == "Keep it small."
        assert final(await create(conn, input="ok", store=False)).status == "completed"


async def test_ws_api_key_checked_before_upgrade(server_factory: Any) -> None:
    """AUTH-2, PROTOCOL §11.9: a wrong key is refused at the handshake with HTTP 401 and the JSON
    error body; the right key (sent by the SDK as ``Authorization: Bearer``) connects."""
    server: LiveServer = await server_factory(server=ServerConfig(api_keys=frozenset({"sk-good"})))
    bad = AsyncOpenAI(base_url=server.base_url, api_key="sk-bad", max_retries=0)
    good = AsyncOpenAI(base_url=server.base_url, api_key="sk-good", max_retries=0)
    try:
        with pytest.raises(InvalidStatus) as info:
            async with bad.responses.connect():
                pass
        assert info.value.response.status_code == 401
        assert json.loads(bytes(info.value.response.body))["error"]["code"] == "invalid_api_key"
        async with good.responses.connect() as conn:
            assert final(await create(conn, input="hi", store=False)).status == "completed"
    finally:
        await bad.close()
        await good.close()
