"""A hypothesis state machine driving a real server over WebSocket on loopback.

``WsProtocolMachine`` interleaves, on one connection at a time (with reconnects): stateless
creates (text, tool calls, several lanes), continuations of the current, a stale, another lane's,
an evicted, a stored or an unknown ``previous_response_id`` with right and wrong tool outputs,
warmups, append-mode rollouts with right / partial / wrong / duplicate / late appends and
injects, bursts of creates queued on lanes (also behind a suspended append rollout, up to the
queue limit), malformed frames (invalid JSON and UTF-8, binary, non-objects, missing or unknown
``type``, wrong field types, ~1 MB strings, deep nesting), steering, disconnects in the middle
of a stream and reconnects.

It keeps a model of what the server must do: each lane's cached latest response (CACHE-1..3:
only the lane's latest is served from the cache; a failed continuation evicts it), the store
(STORE-1/2: ``store: true`` responses stay continuable after eviction and reconnects), the live
append-mode rollouts and their pending calls (APPEND-*), the lane queues (WS-5/WS-6). Every frame
goes through ``StreamChecker`` (ORD-*, ERR-*, WS-7), every request's outcome is predicted and
compared, and after each connection the server's task count must return to its baseline (WS-12).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import settings
from hypothesis.stateful import (
    run_state_machine_as_test,
)

from engine.core import EngineConfig
from engine.models.router import Router, simulator_router
from engine.models.sim.simulator import SimulatedModel
from tests.fuzz._support import (
    LiveEnv,
    examples,
    report,
    timeout_for,
)
from tests.fuzz.ws_machine.machine import WsProtocolMachine
from tests.fuzz.ws_machine.model import (
    MAX_QUEUED,
    SLOW_MODEL,
    SLOW_TPS,
)


def _router() -> Router:
    """The built-in routes at full speed, plus a paced simulator for the steering rules."""
    router = simulator_router(0)
    router.routes[SLOW_MODEL] = SimulatedModel(SLOW_TPS)
    return router


@pytest.fixture
def ws_env() -> Any:
    # Parking (PARK-1) is off here: this model has a closed connection's rollouts retired
    # (WS-12). tests/server/test_park_functional.py covers parked rollouts.
    config = EngineConfig(tokens_per_second=0, max_queued_creates=MAX_QUEUED, park_seconds=0)
    env = LiveEnv(config, _router())
    try:
        yield env
    finally:
        env.close()


@pytest.mark.timeout(timeout_for(120))
def test_ws_protocol_state_machine(ws_env: LiveEnv) -> None:
    machine = type("WsMachine", (WsProtocolMachine,), {"env": ws_env, "tally": Counter()})
    run_state_machine_as_test(
        machine,
        settings=settings(max_examples=examples(ci=1.0, deep=0.2), stateful_step_count=40),
    )
    counters = ws_env.live.engine.counters
    report("WsProtocolMachine", machine.runs, machine.tally, counters)
