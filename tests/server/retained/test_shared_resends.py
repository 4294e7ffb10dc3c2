"""The cluster's resend index costs nothing off a cluster (COMPAT-10), and its candidates are
the ends of the model's runs (``engine/retained/shared_resends.py`` ``candidate_ends``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from engine.retained.shared_resends import MAX_CANDIDATES, candidate_ends
from engine.store import MemoryStore
from protocol.items import FunctionCall, FunctionCallOutput, InputItem, Message, Reasoning
from tests.support.server import LiveServer

ServerFactory = Callable[..., Awaitable[LiveServer]]


def test_candidates_end_where_a_run_of_the_models_items_ends() -> None:
    """COMPAT-10: a response's list ends with its output (reasoning, assistant messages, calls)
    and the client's next item is its own: those ends, longest first, at most 32."""
    user = Message(role="user", content="Weather?")
    think = Reasoning(id="rs_1", summary=[])
    call = FunctionCall(call_id="c1", name="get_weather", arguments="{}")
    output = FunctionCallOutput(call_id="c1", output="sunny")
    answer = Message(role="assistant", content="Sunny.")
    items: list[InputItem] = [user, think, call, output, answer, user, answer]
    assert candidate_ends(items) == [7, 5, 3]
    assert candidate_ends([user, output]) == []
    many: list[InputItem] = [user, answer] * (MAX_CANDIDATES + 5)
    assert candidate_ends(many) == list(range(len(many), 0, -2))[:MAX_CANDIDATES]


async def _post(base_url: str, body: dict[str, Any]) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{base_url}/responses", json=body) as resp,
    ):
        answer: dict[str, Any] = await resp.json()
        assert resp.status == 200, answer
    return answer


async def test_one_process_writes_and_asks_nothing(server_factory: ServerFactory) -> None:
    """COMPAT-10's cost off a cluster: a ``store: true`` response writes its record and
    nothing beside it (counted in the store), and a stateless create no cached list matches
    asks no index."""
    store = MemoryStore()
    server = await server_factory(store=store)
    await _post(server.base_url, {"model": "sim", "input": "Hi", "store": True})
    history = [
        {"role": "user", "content": "Earlier"},
        {"role": "assistant", "content": "An answer held nowhere"},
        {"role": "user", "content": "And now?"},
    ]
    await _post(server.base_url, {"model": "sim", "input": history, "store": False})
    assert len(store) == 1  # the one record
    counters = server.engine.counters
    assert counters["resend.miss"] == 2  # both creates looked in the cache (COMPAT-7)
    assert "resend.shared_miss" not in counters and "resend.shared_hit" not in counters
