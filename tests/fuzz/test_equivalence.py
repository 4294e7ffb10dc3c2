"""Equivalence of the three ways to run one tool-call rollout (SIM-1, COMPAT-*, APPEND-*).

For any generated scenario — a generated tool set with generated JSON schemas, a user text that
names 1 to 3 of the tools, generated (unicode) tool outputs, ``parallel_tool_calls`` on or off,
optional instructions; or the scripted ``sim-coding-agent`` with a random subset of its tools —

(a) the experimental append mode (one response, ``response.append`` of the outputs) and the
    standard WebSocket mode (one response per step, ``previous_response_id``) produce the same
    output items (type, name, arguments, call_id; message text) and the same final text;
(b) the standard mode's fast path (WebSocket, ``previous_response_id``, ``store: false``: the
    same coroutine resumes, COMPAT-2) produces the same result as a stateless HTTP run that
    resends the whole history every turn (COMPAT-5).

The simulator derives call ids from the conversation, so equal histories must give equal ids.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from engine.core import EngineConfig
from engine.models.sim.scenarios import CODING_AGENT_STEPS
from tests.fuzz._support import LiveEnv, WsConn, examples, timeout_for, validate_recorded
from tests.fuzz.ws_machine.model import _recorded

CODING_TOOLS = sorted({step.name for step in CODING_AGENT_STEPS})
MAX_TURNS = 30

# ----------------------------------------------------------------------------- scenarios

tool_names = st.from_regex(r"[a-z][a-z0-9_]{2,11}", fullmatch=True)
schema_values = st.sampled_from(
    [
        {"type": "string"},
        {"type": "integer"},
        {"type": "number"},
        {"type": "boolean"},
        {"type": "array", "items": {"type": "string"}},
        {"type": "string", "enum": ["fast", "slow"]},
        {"type": "object", "properties": {"inner": {"type": "string"}}},
        {"type": ["string", "null"]},
    ]
)
schemas = st.one_of(
    st.none(),
    st.dictionaries(st.from_regex(r"[a-z_]{1,8}", fullmatch=True), schema_values, max_size=4).map(
        lambda props: {"type": "object", "properties": props}
    ),
)
outputs = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=60)
fillers = st.lists(
    st.sampled_from(["please", "then", "Berlin", "Zürich", "the", "東京", "check", "🙂"]),
    max_size=5,
)


@dataclass
class Scenario:
    model: str
    tools: list[dict[str, Any]]
    text: str
    parallel: bool
    instructions: str | None
    outputs: list[str]

    def output(self, index: int) -> str:
        return self.outputs[index % len(self.outputs)]


@st.composite
def sim_scenarios(draw: st.DrawFn) -> Scenario:
    names = draw(st.lists(tool_names, min_size=1, max_size=4, unique=True))
    tools = []
    for name in names:
        tool: dict[str, Any] = {"type": "function", "name": name}
        schema = draw(schemas)
        if schema is not None:
            tool["parameters"] = schema
        tools.append(tool)
    named = draw(st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True))
    words = draw(st.permutations([*named, *draw(fillers)]))
    return Scenario(
        model="sim",
        tools=tools,
        text=" ".join(words),
        parallel=draw(st.booleans()),
        instructions=draw(st.none() | st.text(max_size=30)),
        outputs=draw(st.lists(outputs, min_size=1, max_size=5)),
    )


@st.composite
def coding_scenarios(draw: st.DrawFn) -> Scenario:
    names = draw(st.lists(st.sampled_from(CODING_TOOLS), min_size=1, unique=True))
    return Scenario(
        model="sim-coding-agent",
        tools=[
            {"type": "function", "name": name, "parameters": {"type": "object", "properties": {}}}
            for name in names
        ],
        text=" ".join(draw(fillers)) or "Fix the tests.",
        parallel=draw(st.booleans()),
        instructions=draw(st.none() | st.just("You are a coding agent.")),
        outputs=draw(st.lists(outputs, min_size=1, max_size=5)),
    )


scenarios = st.one_of(sim_scenarios(), coding_scenarios())

# ----------------------------------------------------------------------------- the three runs


def _create(sc: Scenario, items: Any, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": sc.model,
        "input": items,
        "tools": sc.tools,
        "parallel_tool_calls": sc.parallel,
        "store": False,
        **extra,
    }
    if sc.instructions is not None:
        body["instructions"] = sc.instructions
    return body


def _answers(sc: Scenario, calls: list[dict[str, Any]], first: int) -> list[dict[str, Any]]:
    return [
        {"type": "function_call_output", "call_id": call["call_id"], "output": sc.output(first + n)}
        for n, call in enumerate(calls)
    ]


async def _until(conn: WsConn, *types: str) -> dict[str, Any]:
    while True:
        event = await conn.recv()
        assert event["type"] != "error", event
        if event["type"] in types:
            return event


async def run_compat(env: LiveEnv, sc: Scenario) -> tuple[list[dict[str, Any]], int]:
    """Standard WebSocket mode: one response per step, continued by previous_response_id.
    Returns the output items of all responses, and how many responses there were."""
    conn = await WsConn.open(env)
    items: list[Any] = [{"role": "user", "content": sc.text}]
    produced: list[dict[str, Any]] = []
    prev = None
    try:
        for turn in range(1, MAX_TURNS):
            body = _create(sc, items, type="response.create")
            if prev is not None:
                body["previous_response_id"] = prev
            await conn.send(body)
            response = (await _until(conn, "response.completed"))["response"]
            produced += response["output"]
            calls = [o for o in response["output"] if o["type"] == "function_call"]
            if not calls:
                return produced, turn
            items = _answers(sc, calls, _calls_so_far(produced) - len(calls))
            prev = response["id"]
        raise AssertionError("the rollout did not finish")
    finally:
        await conn.close()


async def run_append(env: LiveEnv, sc: Scenario) -> list[dict[str, Any]]:
    """Append mode: one response; each suspension is answered with response.append."""
    conn = await WsConn.open(env)
    try:
        body = _create(
            sc,
            [{"role": "user", "content": sc.text}],
            type="response.create",
            rollout_mode="append",
        )
        await conn.send(body)
        answered = 0
        for _ in range(MAX_TURNS):
            event = await _until(conn, "response.done", "response.completed")
            if event["type"] == "response.completed":
                output: list[dict[str, Any]] = event["response"]["output"]
                return output
            calls = event["pending_calls"]
            await conn.send(
                {
                    "type": "response.append",
                    "response_id": event["response"]["id"],
                    "input": _answers(sc, calls, answered),
                }
            )
            answered += len(calls)
        raise AssertionError("the rollout did not finish")
    finally:
        await conn.close()


async def run_stateless_http(env: LiveEnv, sc: Scenario) -> list[dict[str, Any]]:
    """Stateless HTTP: the whole history is resent every turn (no previous_response_id)."""
    history: list[Any] = [{"role": "user", "content": sc.text}]
    produced: list[dict[str, Any]] = []
    url = f"{env.live.base_url}/responses"
    for _ in range(MAX_TURNS):
        async with env.client.post(url, json=_create(sc, history)) as reply:
            assert reply.status == 200, await reply.text()
            response = await reply.json()
        produced += response["output"]
        calls = [o for o in response["output"] if o["type"] == "function_call"]
        if not calls:
            return produced
        history += response["output"]  # replayed as returned, ids and status included
        history += _answers(sc, calls, _calls_so_far(produced) - len(calls))
    raise AssertionError("the rollout did not finish")


def _calls_so_far(items: list[dict[str, Any]]) -> int:
    return sum(1 for item in items if item["type"] == "function_call")


def normalize(items: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for item in items:
        assert item["status"] == "completed", item
        if item["type"] == "function_call":
            json.loads(item["arguments"])  # SIM-3: arguments are JSON
            out.append(("function_call", item["name"], item["arguments"], item["call_id"]))
        else:
            (part,) = item["content"]
            out.append(("message", part["text"]))
    return out


# ----------------------------------------------------------------------------- properties


@pytest.fixture(scope="module")
def env() -> Any:
    live = LiveEnv(EngineConfig(tokens_per_second=0))
    try:
        yield live
    finally:
        live.close()


_SETTINGS = settings(
    max_examples=examples(ci=0.75, deep=0.1),
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@pytest.mark.timeout(timeout_for(120))
@_SETTINGS
@given(sc=scenarios)
def test_append_mode_matches_compat_mode(env: LiveEnv, sc: Scenario) -> None:
    start = len(_recorded())
    compat = normalize(env.run(run_compat(env, sc))[0])
    append = normalize(env.run(run_append(env, sc)))
    assert append == compat
    assert compat[-1][0] == "message"  # the same final text, at the end
    validate_recorded(start)


@pytest.mark.timeout(timeout_for(120))
@_SETTINGS
@given(sc=scenarios)
def test_fast_path_matches_stateless_http(env: LiveEnv, sc: Scenario) -> None:
    start = len(_recorded())
    counters = env.live.engine.counters
    fast_before = counters["create.fast_path"]
    compat_items, responses = env.run(run_compat(env, sc))
    event(f"{sc.model}: {responses} responses")
    # every continuation resumed the suspended coroutine (COMPAT-2)
    assert counters["create.fast_path"] - fast_before == responses - 1
    http_items = env.run(run_stateless_http(env, sc))
    assert normalize(http_items) == normalize(compat_items)
    validate_recorded(start)
