"""Deterministic reproductions of the bugs the fuzzers found (one test per bug).

A bug that is still open is marked ``@pytest.mark.xfail(reason="BUG: …", strict=True)`` and has
a flag in ``tests/fuzz/known_bugs.py``; when the engine is fixed the test XPASSes (and, strict,
fails), so the mark and the flag go together. The bugs below are fixed; each docstring says what
was wrong.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from engine.core import EngineConfig
from engine.store.memory import MemoryStore
from protocol.codec import parse_input
from protocol.errors import InvalidRequest
from protocol.response import Response
from protocol.states import IllegalTransition, ResponseState
from protocol.stream import ResponseStream
from tests.fuzz._replay import replay
from tests.fuzz._support import LiveEnv
from tests.fuzz.ws_machine.machine import WsProtocolMachine
from tests.fuzz.ws_machine.model import MAX_QUEUED, TOOL_DEFS, AppendLive, Immediate
from tests.support.oracle import sdk_parse
from tests.support.server import LiveServer
from tests.support.tools import WEATHER_LOOSE
from tests.support.ws import read_until, turn

FINDINGS = Path(__file__).parent / "findings"  # failing runs as hypothesis printed them

TOOLS = [WEATHER_LOOSE]


# ----------------------------------------------------------------------------- protocol


@pytest.mark.parametrize("method", ["add_message", "add_function_call"])
@pytest.mark.parametrize("state", ["new", "created", "suspended"])
def test_illegal_add_item_leaves_builder_unchanged(method: str, state: str) -> None:
    """STATE-2. ``ResponseStream.add_message``/``add_function_call`` set the open item before
    ``_step()`` checked the transition: an illegal call (NEW, CREATED, SUSPENDED) raised
    ``IllegalTransition`` but left a phantom open item, which a later ``failed()`` put into
    ``response.output`` although it was never announced."""
    stream = ResponseStream(Response(id="resp_x", created_at=1, model="m"))
    if state != "new":
        stream.created()
    if state == "suspended":
        stream.in_progress()
        stream.suspend([])
    args = ("f", "call_1") if method == "add_function_call" else ()
    with pytest.raises(IllegalTransition):
        getattr(stream, method)(*args)
    assert stream.state is ResponseState(state)
    assert not stream.has_open_item  # was: a phantom open item
    if state != "new":
        stream.failed("server_error", "The model failed.", None, 1)
        assert stream.response.output == []  # was: the phantom item showed up as output


# ----------------------------------------------------------------------------- WebSocket


async def _round_trip_parent(
    ws: aiohttp.ClientWebSocketResponse, store: bool = False
) -> tuple[str, str]:
    """A standard response that ended in a tool call: (response id, call id)."""
    await ws.send_json(
        {"type": "response.create", "input": "Weather in Paris?", "tools": TOOLS, "store": store}
    )
    done = (await read_until(ws, "response.completed"))[-1]["response"]
    return done["id"], done["output"][0]["call_id"]


@pytest.mark.parametrize(
    "frame",
    [
        "[" * 10_000 + "]" * 10_000,
        '{"type":"response.create","input":' + "[" * 10_000 + "]" * 10_000 + "}",
        '{"type":"response.create","metadata":{"k":' + "[" * 10_000 + "]" * 10_000 + "}}",
    ],
    ids=["frame", "input", "metadata"],
)
async def test_deeply_nested_ws_frame_is_a_request_error(server: LiveServer, frame: str) -> None:
    """ERR-4. msgspec raises ``RecursionError`` on 10,000 nested arrays; the WS driver caught only
    ``ProtocolError``, so the exception escaped ``serve_socket`` and killed the connection."""
    async with aiohttp.ClientSession() as http, http.ws_connect(server.ws_url) as ws:
        await ws.send_str(frame)
        error = (await read_until(ws, "error"))[-1]  # was: the socket closed instead
        assert error["status"] == 400
        await ws.send_json({"type": "response.create", "input": "still there?"})
        assert (await read_until(ws, "response.completed"))[-1]["type"] == "response.completed"


async def test_deeply_nested_http_body_is_a_400(server: LiveServer) -> None:
    """§12. The same ``RecursionError`` over HTTP became a 500 ``server_error`` although the
    client is at fault."""
    body = '{"input":' + "[" * 10_000 + "]" * 10_000 + "}"
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{server.base_url}/responses", data=body) as response,
    ):
        assert response.status == 400, await response.text()  # was: 500


async def test_append_to_a_standard_response_names_no_lane_with_the_multi_agent_beta(
    server: LiveServer,
) -> None:
    """APPEND-5, WS-7, INJECT-8. On a connection with OpenAI's multi-agent beta, a plain
    ``response.append`` naming a standard-mode response that waits for its calls (an inject
    target, not an append target) got its 404 ``response_not_found`` with the response's lane
    as ``stream_id``: the lane lookup for inject errors answered appends too (live fuzz, dev
    profile). A target error carries no lane."""
    beta = {"OpenAI-Beta": "responses_multi_agent=v1"}
    create = {"type": "response.create", "model": "sim", "stream_id": "a", "store": False}
    async with aiohttp.ClientSession() as http, http.ws_connect(server.ws_url, headers=beta) as ws:
        await ws.send_json({**create, "input": "Weather in Paris?", "tools": TOOLS})
        done = (await read_until(ws, "response.completed"))[-1]["response"]
        call = next(i for i in done["output"] if i["type"] == "function_call")
        answer = [{"type": "function_call_output", "call_id": call["call_id"], "output": "sun"}]
        await ws.send_json({"type": "response.append", "response_id": done["id"], "input": answer})
        error = (await read_until(ws, "error"))[-1]
        assert error["error"]["code"] == "response_not_found" and error["status"] == 404
        assert "stream_id" not in error, error  # was: "stream_id": "a"


@pytest.mark.parametrize(
    "garbage",
    [
        [1, 2],
        [{"foo": 1}],
        [{"type": "bogus"}],
        [{"type": ["message"]}],  # deep fuzz, seed 905289082: a list as the type
        [{"type": {"t": 1}}],
    ],
)
async def test_inject_failed_for_unknown_target_parses_with_sdk(
    server: LiveServer, garbage: list[Any]
) -> None:
    """CONF-1. ``response.inject.failed`` (unknown or finished target) echoed the raw ``input``;
    anything but a list of valid items made the event fail the SDK's model."""
    async with aiohttp.ClientSession() as http, http.ws_connect(server.ws_url) as ws:
        await ws.send_json({"type": "response.inject", "response_id": "resp_x", "input": garbage})
        event = (await read_until(ws, "response.inject.failed", "error"))[-1]
        # An unknown target is answered with inject.failed (APPEND-5), never a plain error.
        assert event["type"] == "response.inject.failed", event
        assert event["error"]["code"] == "response_not_found"
        sdk_parse(event)  # was: the echoed input was not a list of input items
        # The socket is still usable: an unhashable ``type`` crashed the handler (ERR-3), and
        # aiohttp's 500 on the upgraded socket reached the client as a frame with RSV bits.
        await ws.send_json({"type": "response.create", "model": "sim", "input": "hi"})
        assert (await read_until(ws, "response.completed"))[-1]["type"] == "response.completed"


@pytest.mark.parametrize("bad", [["message"], {"t": 1}, 3])
def test_an_item_type_that_is_no_string_is_a_request_error(bad: Any) -> None:
    """CODEC-3 (deep fuzz, seed 905289082): ``parse_input`` looked a non-string ``type`` up in
    a set and raised ``TypeError``; it is an ordinary 400 with the item's path."""
    with pytest.raises(InvalidRequest) as err:
        parse_input([{"type": "message", "role": "user", "content": "x"}, {"type": bad}])
    assert err.value.param is not None and err.value.param.startswith("input[1]")


@pytest.mark.parametrize("garbage", [[1, 2], [{"foo": 1}]])
async def test_steer_failed_parses_with_sdk(server: LiveServer, garbage: list[Any]) -> None:
    """CONF-1. ``response.steer.failed`` echoed the raw ``input`` into ``steer.input``, which the
    SDK accepts only as a string or user messages."""
    async with aiohttp.ClientSession() as http, http.ws_connect(server.ws_url) as ws:
        await ws.send_json(
            {"type": "response.steer", "previous_response_id": "resp_x", "input": garbage}
        )
        event = (await read_until(ws, "response.steer.failed", "error"))[-1]
        assert event["type"] == "response.steer.failed", event  # STEER-7: never a plain error
        assert event["error"]["code"] == "response_not_found"
        sdk_parse(event)  # was: a validation error


async def test_store_path_error_param_indexes_the_request_input(server: LiveServer) -> None:
    """CODEC-3/VAL-1. The store path validated ``stored context + input`` as one list, so item
    error params were offset by the stored context's length (``input[3]`` for ``input[1]``)."""
    async with aiohttp.ClientSession() as http, http.ws_connect(server.ws_url) as ws:
        parent, call_id = await _round_trip_parent(ws, store=True)
    async with aiohttp.ClientSession() as http, http.ws_connect(server.ws_url) as ws:
        await ws.send_json(  # a new connection: the parent comes from the store (COMPAT-4)
            {
                "type": "response.create",
                "previous_response_id": parent,
                "input": [
                    {"type": "function_call_output", "call_id": call_id, "output": "sunny"},
                    {"type": "function_call_output", "call_id": "call_nope", "output": "x"},
                ],
            }
        )
        error = (await read_until(ws, "error"))[-1]
        assert error["error"]["code"] == "unknown_call_id"
        assert error["error"]["param"] == "input[1].call_id"  # was: input[3].call_id


@pytest.mark.parametrize("frame", ["0:", "[1,", "1 2", "true false", '{"a":1}x', '{"type":"nope"'])
async def test_not_json_is_invalid_json(server: LiveServer, frame: str) -> None:
    """CODEC-2. msgspec's typed decoder stops at the first value of the wrong shape, before it
    sees that the rest is not JSON, so such frames and bodies got ``invalid_type``,
    ``missing_required_parameter`` or ``invalid_value`` instead of ``invalid_json``."""
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(server.ws_url) as ws:
            await ws.send_str(frame)
            error = (await read_until(ws, "error"))[-1]
            assert error["error"]["code"] == "invalid_json", error
        if not frame.startswith("{"):
            async with http.post(f"{server.base_url}/responses", data=frame) as response:
                body = await response.json()
                assert body["error"]["code"] == "invalid_json", body


async def test_metadata_error_param_is_a_json_path(server: LiveServer) -> None:
    """CODEC-3. A bad metadata value got msgspec's path ``metadata[...]``, not a JSON path."""
    async with aiohttp.ClientSession() as http, http.ws_connect(server.ws_url) as ws:
        await ws.send_json({"type": "response.create", "input": "x", "metadata": {"k": 1}})
        error = (await read_until(ws, "error"))[-1]
        assert error["error"]["code"] == "invalid_type"
        assert error["error"]["param"] == "metadata.k", error  # was: 'metadata[...]'


# ----------------------------------------------------------------------------- issue 13
# Three failures of the deep profile, one root cause, in the model (the server was right): the
# model expected the error of the double append (the same outputs appended again right after
# the append that resumed the rollout) as "one of three codes, on any lane". The resumed
# rollout ends and frees its lane; a create queued there behind it runs, and a ``dup_output``
# history is rejected with ``duplicate_tool_output`` (``input[3].call_id``, on that lane).
# When that error came first it was taken for the append's, and then
# (1) the next queued create's ``response.created`` was taken as the rejected create running,
# (2) the append's real ``response_already_completed`` was taken as the create's error,
# (3) or it arrived with nothing left to match it. The server reads the second append when it
# reads it (WS-5), so its error may come before or after the lane's events, and as a target
# error it carries no ``stream_id`` (APPEND-5, WS-7).


@pytest.mark.timeout(120)
@pytest.mark.parametrize("finding", ["issue13-failure1", "issue13-failure2", "issue13-failure3"])
def test_issue13_printed_runs_replay_green(finding: str) -> None:
    """FUZZ-2, WS-5, APPEND-5. The three failing runs, replayed step by step with their
    printed draws. Before the model fix each failed every time it was replayed."""
    env = LiveEnv(EngineConfig(tokens_per_second=0, max_queued_creates=MAX_QUEUED))
    try:
        machine = type("WsMachine", (WsProtocolMachine,), {"env": env, "tally": Counter()})
        replay(machine(), (FINDINGS / f"{finding}.txt").read_text(encoding="utf-8"))
    finally:
        env.close()


@pytest.mark.parametrize("forced", [False, True])
def test_double_append_error_is_matched_by_its_exact_shape(forced: bool) -> None:
    """APPEND-5, VAL-2. The model's expectation for the double append: the queued create's
    ``duplicate_tool_output`` at ``input[3].call_id`` on the same lane is not its answer (was:
    any error with one of the three codes, on any lane)."""
    live = AppendLive("resp_x", "b.2-x", ["get_weather"], "get_weather" if forced else None,
                      store=False, pending=[])  # fmt: skip
    double = Immediate("error", shapes=WsProtocolMachine._double_append_errors(live))
    assert not double.is_answered_by("duplicate_tool_output", "input[3].call_id", "b.2-x")
    assert double.is_answered_by("response_already_completed", "response_id", None)
    assert not double.is_answered_by("response_already_completed", "response_id", "b.2-x")
    assert double.is_answered_by("response_not_waiting", None, "b.2-x")
    assert not double.is_answered_by("response_not_waiting", None, None)
    # waiting for its next forced call: the outputs again are duplicates, from the first one
    assert double.is_answered_by("duplicate_tool_output", "input[0].call_id", "b.2-x") is forced


def _dup_history(lane: str | None = None, store: bool = True) -> dict[str, Any]:
    call = {"type": "function_call", "call_id": "call_h1", "name": "get_weather",
            "arguments": "{}", "id": "fc_h1", "status": "completed"}  # fmt: skip
    output = {"type": "function_call_output", "call_id": "call_h1", "output": "sunny"}
    body: dict[str, Any] = {
        "input": [{"role": "user", "content": "hi"}, call, output, output],
        "tools": TOOLS,
        "store": store,
    }
    if lane is not None:
        body["stream_id"] = lane
    return body


@pytest.mark.parametrize(
    ("transport", "lane", "store", "mode"),
    [
        ("http", None, True, None),
        ("http", None, False, None),
        ("ws", None, True, None),
        ("ws", None, False, None),
        ("ws", "b.2-x", False, None),
        ("ws", "b.2-x", False, "append"),
    ],
)
async def test_duplicate_output_in_a_history_is_rejected(
    server: LiveServer, transport: str, lane: str | None, store: bool, mode: str | None
) -> None:
    """VAL-2. A stateless create whose history answers one call twice is rejected with
    ``duplicate_tool_output`` at ``input[3].call_id`` on every create path (issue 13 asked
    whether one accepted it: none does)."""
    body = _dup_history(lane, store)
    if mode is not None:
        body["rollout_mode"] = mode
    async with aiohttp.ClientSession() as http:
        if transport == "http":
            async with http.post(f"{server.base_url}/responses", json=body) as response:
                assert response.status == 400
                error = (await response.json())["error"]
        else:
            async with http.ws_connect(server.ws_url) as ws:
                await ws.send_json({"type": "response.create", **body})
                event = (await read_until(ws, "error", "response.created"))[-1]
                assert event["type"] == "error" and event.get("stream_id") == lane, event
                error = event["error"]
    assert (error["code"], error["param"]) == ("duplicate_tool_output", "input[3].call_id")


async def test_queued_duplicate_output_create_behind_a_double_append(server: LiveServer) -> None:
    """WS-5, APPEND-5, VAL-2. Failure 1's situation on the wire: an append-mode rollout holds lane
    ``b.2-x``; a ``dup_output`` create and a plain create wait behind it; the pending call is
    answered and the same output appended again. The rejected create gets exactly one
    ``duplicate_tool_output`` error on its lane, the plain create runs once, and the second
    append gets its own error (not waiting, or already completed and then without
    ``stream_id``), in whichever order the server produces them."""
    lane = "b.2-x"
    async with aiohttp.ClientSession() as http, http.ws_connect(server.ws_url) as ws:
        await ws.send_json(
            {"type": "response.create", "input": "Weather in Paris?", "tools": TOOLS,
             "rollout_mode": "append", "store": False, "stream_id": lane}
        )  # fmt: skip
        done = (await read_until(ws, "response.done"))[-1]
        rid, call_id = done["response"]["id"], done["pending_calls"][0]["call_id"]
        await ws.send_json({"type": "response.create", **_dup_history(lane, store=False)})
        await ws.send_json({"type": "response.create", "input": "next", "stream_id": lane})
        output = {"type": "function_call_output", "call_id": call_id, "output": "ok"}
        append = {"type": "response.append", "response_id": rid, "input": [output]}
        await ws.send_json(append)
        await ws.send_json(append)
        errors: list[dict[str, Any]] = []
        created: list[str] = []
        completed: list[str] = []
        while len(errors) < 2 or len(completed) < 2:
            event = (await read_until(ws, "error", "response.created", "response.completed"))[-1]
            if event["type"] == "error":
                errors.append(event)
            elif event["type"] == "response.created":
                created.append(event["response"]["id"])
            else:
                completed.append(event["response"]["id"])
    shapes = sorted((e["error"]["code"], e["error"]["param"], e.get("stream_id")) for e in errors)
    assert ("duplicate_tool_output", "input[3].call_id", lane) in shapes, shapes
    second = next(s for s in shapes if s[0] != "duplicate_tool_output")
    assert second in {
        ("response_already_completed", "response_id", None),
        ("response_not_waiting", None, lane),
    }, shapes
    assert len(created) == 1 and completed == [rid, created[0]], (created, completed)


async def test_a_bad_listing_query_is_refused_before_its_lookup(server: LiveServer) -> None:
    """CONV-3, HTTP-6. Found by the live conversation machine (ci profile, seed 3514272902)
    when the listings came to share one page rule: ``order=up`` on an unknown conversation was
    answered 404 ``conversation_not_found`` instead of 400 ``invalid_value`` (``order``); the
    query is checked first, as before."""
    url = f"{server.base_url}/conversations/conv_{'0' * 32}/items"
    async with aiohttp.ClientSession() as http:
        for query, param in (({"order": "up"}, "order"), ({"limit": "0"}, "limit")):
            async with http.get(url, params=query) as response:
                body = await response.json()
                assert response.status == 400, body
                assert (body["error"]["code"], body["error"]["param"]) == ("invalid_value", param)


async def _a_continuation_past_an_eviction(
    server_factory: Callable[..., Awaitable[LiveServer]], *, evict_before_the_resend: bool
) -> None:
    """STORE-2. A memory store of two places; a stored response whose full item list is its
    input; a ``store: false`` create resending that list (COMPAT-7); its tool calls' outputs
    continued with ``store: true`` on the fast path (COMPAT-2). Two others take the store's two
    places (LIM-5), before the resend on this connection or after it on another; either way the
    continuation is stored whole and reads back."""
    server = await server_factory(
        EngineConfig(tokens_per_second=0, park_seconds=0), store=MemoryStore(max_entries=2)
    )
    tools = [TOOL_DEFS["get_weather"]]
    first = {"type": "response.create", "rollout_mode": "standard", "tools": tools}
    tokyo = [{"role": "user", "content": "Tokyo then"}]

    async def evict(ws: aiohttp.ClientWebSocketResponse) -> None:
        for n in range(2):  # the store's two places go to others (LIM-5)
            await turn(ws, {"type": "response.create", "input": f"other {n}"})
        assert await server.engine.store.hydrate(evicted) is None

    async with aiohttp.ClientSession() as http, http.ws_connect(server.ws_url) as ws:
        warm = {**first, "input": tokyo, "generate": False}  # full item list: the input
        evicted = (await turn(ws, warm))[-1]["response"]["id"]
        if evict_before_the_resend:
            await evict(ws)
        done = (await turn(ws, {**first, "input": tokyo, "store": False}))[-1]["response"]
        if not evict_before_the_resend:
            assert server.engine.counters["create.resent"] == 1  # its context: the stored one's
        calls = [item["call_id"] for item in done["output"] if item["type"] == "function_call"]
        assert calls
        if not evict_before_the_resend:
            async with aiohttp.ClientSession() as other, other.ws_connect(server.ws_url) as ws2:
                await evict(ws2)
        outputs = [{"type": "function_call_output", "call_id": c, "output": ""} for c in calls]
        done = (await turn(ws, {**first, "previous_response_id": done["id"], "input": outputs}))[-1]
        assert done["type"] == "response.completed", done
        child = done["response"]["id"]
    stored = await server.engine.store.hydrate(child)
    assert stored is not None  # STORE-2; was: None, a link to the evicted record
    assert stored.record.response.status == "completed"


async def test_a_stored_continuation_of_an_unstored_round_trip_is_stored(
    server_factory: Callable[..., Awaitable[LiveServer]],
) -> None:
    """STORE-2, HYD-5, COMPAT-7 (deep WS fuzz, seed 250566750). A ``store: false`` create
    resent a stored response's full item list after the memory store had evicted that response
    (LIM-5); its cached context was served as still stored (the memory store's deletes reach
    the cache, its evictions did not), so its ``store: true`` continuation on the fast path
    (COMPAT-2) was written as a chain record linking the evicted one: unreadable, lost."""
    await _a_continuation_past_an_eviction(server_factory, evict_before_the_resend=True)


async def test_an_evicted_memory_record_is_not_continued_from_the_cache(
    server_factory: Callable[..., Awaitable[LiveServer]],
) -> None:
    """HYD-5, LIM-5. The memory store evicts a stored response while the hydration cache still
    holds its context; a ``previous_response_id`` continuation of it from another connection
    (no lane cache of its own, CACHE-1) is ``previous_response_not_found``, as the store says,
    never continued from the cached context of a record that is gone."""
    server = await server_factory(
        EngineConfig(tokens_per_second=0, park_seconds=0), store=MemoryStore(max_entries=2)
    )
    async with aiohttp.ClientSession() as http, http.ws_connect(server.ws_url) as ws:
        done = (await turn(ws, {"type": "response.create", "input": "Tokyo then"}))[-1]
        evicted = done["response"]["id"]
        assert evicted in server.engine.hydrated  # its context, cached (HYD-1)
        for n in range(2):  # the store's two places go to others (LIM-5)
            await turn(ws, {"type": "response.create", "input": f"other {n}"})
        assert await server.engine.store.hydrate(evicted) is None
        assert evicted in server.engine.hydrated
    async with aiohttp.ClientSession() as http, http.ws_connect(server.ws_url) as ws:
        again = {"type": "response.create", "previous_response_id": evicted, "input": "and?"}
        error = (await turn(ws, again))[-1]
    assert error["type"] == "error" and error["status"] == 400, error
    assert error["error"]["code"] == "previous_response_not_found"
    assert evicted not in server.engine.hydrated  # dropped on the miss


async def test_a_record_whose_ancestor_was_evicted_is_written_whole(
    server_factory: Callable[..., Awaitable[LiveServer]],
) -> None:
    """STORE-2 (deep WS fuzz, seed 250566750, its second shrink). A ``store: false`` create
    forks a stored response's context (COMPAT-7) while the record is held; the memory store
    then evicts it (LIM-5); the ``store: true`` continuation on the fast path (COMPAT-2) must
    not link the evicted record: it is written whole, and reads back."""
    await _a_continuation_past_an_eviction(server_factory, evict_before_the_resend=False)
