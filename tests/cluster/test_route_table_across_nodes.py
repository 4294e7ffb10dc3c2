"""LIVE-7: SPEC §11.10's route table walked through two nodes behind real HAProxy. The table
lists exactly the app's routes (HEAD twins aside); every route is then called on the "wrong"
node: whatever live state it names (a suspended rollout, a running background run, a stored
response) was made on node 0 and the call goes through the balancer to node 1 (the turn-state
token picks the node, TURN-1). Each answers as the right node would, or as the table says."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI

from cli.launcher import Cluster
from tests.cluster.conftest import KEYS, OPERATOR, cluster_spec, node_counters, via
from tests.support.server import start_server
from tests.support.tools import WEATHER

MODEL = "gpt-x"
KEY = KEYS[0]
SPEC = Path(__file__).parents[2] / "SPEC.md"
LONG = " ".join(f"word{n}" for n in range(40))  # a background run lasting seconds at 10 tok/s
ID = "/v1/responses/{response_id}"
CONV = "/v1/conversations/{conversation_id}"


def spec_routes() -> set[tuple[str, str]]:
    """The (method, path) rows of LIVE-7's table."""
    text = SPEC.read_text()
    start = text.index("| method | path | needs the node with live state |")
    rows = set()
    for line in text[start:].splitlines()[2:]:
        found = re.match(r"\s*\| (GET|POST|DELETE) \| `([^`]+)` \|", line)
        if found is None:
            break
        rows.add((found.group(1), found.group(2)))
    return rows


@dataclass
class Walk:
    cluster: Cluster
    http: aiohttp.ClientSession
    sdk: AsyncOpenAI

    @property
    def base(self) -> str:
        return self.cluster.url.removesuffix("/v1")

    async def call(self, method: str, path: str, node: int, **kw: Any) -> tuple[int, bytes]:
        headers = {"Authorization": f"Bearer {KEY}", **via(node), **kw.pop("headers", {})}
        async with self.http.request(method, self.base + path, headers=headers, **kw) as resp:
            return resp.status, await resp.content.read(4096)

    async def suspended(self) -> Any:
        """A ``store: false`` rollout suspended on a tool call on node 0, its socket closed."""
        async with self.sdk.responses.connect(extra_headers=via(0)) as conn:
            await conn.response.create(
                model=MODEL, input="Weather in Paris?", tools=[WEATHER], store=False
            )
            async for event in conn:
                if event.type == "response.completed":
                    return event.response
        raise AssertionError("no response")

    async def stored(self) -> str:
        status, body = await self.call(
            "POST", "/v1/responses", 0, json={"model": MODEL, "input": "Say hi"}
        )
        assert status == 200, body
        return str(re.search(rb'"id":"(resp_[^"]+)"', body).group(1).decode())

    async def running(self) -> str:
        created = await self.sdk.responses.create(
            model=MODEL, input=LONG, background=True, extra_headers=via(0)
        )
        return created.id

    async def same_on_both(self, method: str, path: str, **kw: Any) -> None:
        right, wrong = (
            await self.call(method, path, 0, **kw),
            await self.call(method, path, 1, **kw),
        )
        assert right[0] == wrong[0] and wrong[0] < 500, (path, right, wrong)


def _output(call: Any) -> list[dict[str, str]]:
    return [{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}]


async def _ws(w: Walk) -> None:
    first = await w.suspended()
    async with w.sdk.responses.connect(extra_headers=via(1)) as conn:
        await conn.response.create(
            model=MODEL, tools=[WEATHER], store=False, previous_response_id=first.id,
            input=_output(first.output[-1]),
        )  # fmt: skip
        async for event in conn:
            if event.type in ("response.completed", "error"):
                assert event.type == "response.completed", event
                return


async def _http_create(w: Walk) -> None:
    first = await w.suspended()
    body = {"model": MODEL, "tools": [WEATHER], "store": False,
            "previous_response_id": first.id, "input": _output(first.output[-1])}  # fmt: skip
    status, answer = await w.call("POST", "/v1/responses", 1, json=body)
    assert status == 200 and b'"status":"completed"' in answer, answer


async def _by_stored(w: Walk, path: str) -> None:
    rid = await w.stored()
    body = {"model": MODEL, "previous_response_id": rid, "input": "more"}
    status, answer = await w.call("POST", path, 1, json=body)
    assert status == 200, answer


async def _get_running(w: Walk) -> None:
    rid = await w.running()
    status, answer = await w.call("GET", f"/v1/responses/{rid}", 1)
    assert status == 200 and b'"background":true' in answer, answer
    status, answer = await w.call("GET", f"/v1/responses/{rid}?stream=true&starting_after=-1", 1)
    assert status == 200 and b'"sequence_number":0' in answer, answer


async def _delete_running(w: Walk) -> None:
    rid = await w.running()
    before = (await node_counters(w.cluster))[0].get("runs.remote_cancelled", 0)
    status, answer = await w.call("DELETE", f"/v1/responses/{rid}", 1)
    assert status == 200, answer
    assert (await node_counters(w.cluster))[0].get("runs.remote_cancelled", 0) == before + 1


async def _cancel_running(w: Walk) -> None:
    rid = await w.running()
    status, answer = await w.call("POST", f"/v1/responses/{rid}/cancel", 1)
    assert status == 200 and b'"status":"cancelled"' in answer, answer


async def _stored_read(w: Walk, suffix: str) -> None:
    rid = await w.stored()
    await w.same_on_both("GET", f"/v1/responses/{rid}{suffix}")


async def _conversation(w: Walk) -> tuple[str, str]:
    """A conversation with one item, made on node 0: its id and its item's id."""
    body = {"items": [{"role": "user", "content": "I live in Oslo."}]}
    status, answer = await w.call("POST", "/v1/conversations", 0, json=body)
    assert status == 200, answer
    cid = re.search(rb'"id":"(conv_[^"]+)"', answer).group(1).decode()
    status, answer = await w.call("GET", f"/v1/conversations/{cid}/items", 0)
    assert status == 200, answer
    return cid, re.search(rb'"id":"([^"]+)"', answer).group(1).decode()


async def _on_conversation(w: Walk, method: str, suffix: str, **kw: Any) -> None:
    """CONV-*: a conversation made on node 0 answers on node 1 from the shared store."""
    cid, item = await _conversation(w)
    path = f"/v1/conversations/{cid}{suffix.replace('{item}', item)}"
    status, answer = await w.call(method, path, 1, **kw)
    assert status == 200, (path, answer)


async def _new_conversation(w: Walk) -> None:
    status, answer = await w.call("POST", "/v1/conversations", 1, json={"items": []})
    assert status == 200, answer


async def _logout(w: Walk) -> None:
    """AUTH-14: sign-out answers on any node (a session another node opened is its own)."""
    origin = {"Origin": w.base}
    status, _ = await w.call("POST", "/inspect/logout", 1, headers=origin, allow_redirects=False)
    assert status == 303


async def _node_only(w: Walk, path: str) -> None:
    status, _ = await w.call("POST", path, 1, json={"response_id": "resp_x"})
    assert status == 403  # the balancer refuses /cluster/ (CLUSTER-12)


Step = Callable[[Walk], Awaitable[None]]
OPERATOR_ONLY = {"Authorization": f"Bearer {OPERATOR}"}
CALLS: dict[tuple[str, str], Step] = {
    ("GET", "/v1/responses"): _ws,
    ("POST", "/v1/responses"): _http_create,
    ("POST", "/v1/responses/compact"): lambda w: _by_stored(w, "/v1/responses/compact"),
    ("POST", "/v1/responses/input_tokens"): lambda w: _by_stored(w, "/v1/responses/input_tokens"),
    ("GET", "/v1/responses/tokens/export"): lambda w: w.same_on_both(
        "GET", "/v1/responses/tokens/export"
    ),
    ("GET", ID): _get_running,
    ("DELETE", ID): _delete_running,
    ("POST", ID + "/cancel"): _cancel_running,
    ("GET", ID + "/input_items"): lambda w: _stored_read(w, "/input_items"),
    ("GET", ID + "/tokens"): lambda w: _stored_read(w, "/tokens"),
    ("GET", "/v1/models"): lambda w: w.same_on_both("GET", "/v1/models"),
    ("GET", "/healthz"): lambda w: w.same_on_both("GET", "/healthz"),
    ("GET", "/debug/stats"): lambda w: w.same_on_both("GET", "/debug/stats", headers=OPERATOR_ONLY),
    ("GET", "/metrics"): lambda w: w.same_on_both("GET", "/metrics", headers=OPERATOR_ONLY),
    ("GET", "/inspect"): lambda w: w.same_on_both("GET", "/inspect"),
    ("POST", "/inspect/login"): lambda w: w.same_on_both(
        "POST", "/inspect/login", data={"key": KEY}, allow_redirects=False
    ),
    ("GET", "/inspect/feed"): lambda w: w.same_on_both("GET", "/inspect/feed"),
    ("POST", "/inspect/logout"): _logout,
    ("POST", "/v1/conversations"): _new_conversation,
    ("GET", CONV): lambda w: _on_conversation(w, "GET", ""),
    ("POST", CONV): lambda w: _on_conversation(w, "POST", "", json={"metadata": {"a": "b"}}),
    ("DELETE", CONV): lambda w: _on_conversation(w, "DELETE", ""),
    ("GET", CONV + "/items"): lambda w: _on_conversation(w, "GET", "/items"),
    ("POST", CONV + "/items"): lambda w: _on_conversation(
        w, "POST", "/items", json={"items": [{"role": "user", "content": "Thanks"}]}
    ),
    ("GET", CONV + "/items/{item_id}"): lambda w: _on_conversation(w, "GET", "/items/{item}"),
    ("DELETE", CONV + "/items/{item_id}"): lambda w: _on_conversation(w, "DELETE", "/items/{item}"),
    ("POST", "/cluster/v1/handover"): lambda w: _node_only(w, "/cluster/v1/handover"),
    ("POST", "/cluster/v1/runs/cancel"): lambda w: _node_only(w, "/cluster/v1/runs/cancel"),
    ("POST", "/cluster/v1/runs/events"): lambda w: _node_only(w, "/cluster/v1/runs/events"),
    ("POST", "/cluster/v1/idempotent/follow"): lambda w: _node_only(
        w, "/cluster/v1/idempotent/follow"
    ),
}


async def test_the_table_lists_every_route_of_the_app() -> None:
    """LIVE-7: the SPEC table, the walk below and the app's routes are one set."""
    live = await start_server()
    try:
        app = {
            (route.method, route.resource.canonical)
            for route in live.runner.app.router.routes()
            if route.resource is not None and route.method != "HEAD"
        }
    finally:
        await live.runner.cleanup()
    assert spec_routes() == app == set(CALLS)


@pytest.fixture
async def walk(tmp_path: Path) -> AsyncIterator[Walk]:
    cluster = Cluster(cluster_spec(tmp_path, "haproxy", "--tps", "10", keyed=True))
    await cluster.start()
    try:
        async with aiohttp.ClientSession() as http:
            sdk = AsyncOpenAI(base_url=cluster.url, api_key=KEY, max_retries=0)
            try:
                yield Walk(cluster, http, sdk)
            finally:
                await sdk.close()
    finally:
        await cluster.stop()


@pytest.mark.timeout(300)
async def test_every_route_from_the_wrong_node(walk: Walk) -> None:
    """LIVE-7: each route of the table, called through HAProxy on node 1 about state node 0
    holds, answers as the table says."""
    for route in sorted(spec_routes()):
        await CALLS[route](walk)
