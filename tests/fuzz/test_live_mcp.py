"""The remote MCP rule group: a hypothesis state machine over a real server and a real MCP
server (SPEC §18; the ``mcp`` SDK's server, ``tests/support/mcp_server.py``, its own process).

``McpMachine`` interleaves creates with an ``mcp`` tool (``require_approval`` ``never`` or
``always``; a live server, one that is down, one refused as private, MCP-10) over JSON or SSE,
the answers to pending approval requests (approve, deny, an unknown id), continuations of
finished chains and continuations that leave a request unanswered. The model is each chain's
server, policy, whether it was listed and its pending request: every response's output item
types and fields are what the model says (MCP-4, MCP-7, MCP-8, MCP-9, MCP-18, VAL-5), every
SSE stream orders its MCP items' events as ORD-9 says, and every error is the §12 envelope.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    precondition,
    rule,
    run_state_machine_as_test,
)
from openai.types.responses import Response

from engine.core import EngineConfig
from tests.fuzz._support import LiveEnv, check_error_body, examples, report, timeout_for
from tests.support.mcp import sdk_server
from tests.support.server import free_port

SERVERS = ("live", "down", "refused")


@dataclass
class Chain:
    """One response chain: its tool, and what the model expects of its next turn."""

    last: str  # the latest response id
    tool: dict[str, Any]
    server: str
    approval: str
    pending: str | None = None  # an approval request awaiting its answer


# ORD-9: each MCP item's events, in order (the item's own ``output_item.added`` / ``.done``
# around them); an approved call runs from ``mcp_call.in_progress`` without argument events
# (MCP-9: its arguments are the request's, complete in ``output_item.added``); a denied one
# never runs: ``mcp_call.failed`` alone.
APPROVED = re.compile(r"added mcp_call\.in_progress mcp_call\.(completed|failed) done")
DENIED = re.compile(r"added mcp_call\.failed done")
ORDER = {
    "mcp_list_tools": re.compile(
        r"added mcp_list_tools\.in_progress mcp_list_tools\.(completed|failed) done"
    ),
    "mcp_call": re.compile(
        r"added mcp_call\.in_progress( mcp_call_arguments\.delta)*"
        r" mcp_call_arguments\.done mcp_call\.(completed|failed) done"
    ),
    "mcp_approval_request": re.compile(r"added done"),
}
_SHORT = {"response.output_item.added": "added", "response.output_item.done": "done"}


class McpMachine(RuleBasedStateMachine):
    env: LiveEnv
    urls: dict[str, str]
    runs = 0
    tally: Counter[str]

    def __init__(self) -> None:
        super().__init__()
        type(self).runs += 1
        self.chains: list[Chain] = []

    def _pick(self, data: st.DataObject, pending: bool) -> Chain:
        found = [chain for chain in self.chains if (chain.pending is not None) == pending]
        return data.draw(st.sampled_from(found), label="chain")

    def _has(self, pending: bool) -> bool:
        return any((chain.pending is not None) == pending for chain in self.chains)

    # ------------------------------------------------------------------ I/O
    def _post(self, body: dict[str, Any], stream: bool) -> tuple[int, Any]:
        """A create; a streamed one is checked for ORD-9 and answers its final response."""

        async def go() -> tuple[int, str]:
            url = f"http://127.0.0.1:{self.env.live.port}/v1/responses"
            async with self.env.client.post(url, json={**body, "stream": stream}) as resp:
                return resp.status, await resp.text()

        status, text = self.env.run(go(), timeout=60)
        if status != 200 or not stream:
            return status, json.loads(text)
        return status, _ordered(text, self.tally)

    def _error(self, answer: tuple[int, Any], code: str, param: str) -> None:
        assert answer[0] == 400, answer
        error = check_error_body(answer[1]["error"], 400)
        assert (error["code"], error["param"]) == (code, param), error
        self.tally[f"error {code}"] += 1

    # ------------------------------------------------------------------ rules
    @initialize()
    def first(self) -> None:
        self.create("live", "always", True)

    @rule(
        server=st.sampled_from(SERVERS),
        approval=st.sampled_from(["never", "always"]),
        stream=st.booleans(),
    )
    def create(self, server: str, approval: str, stream: bool) -> None:
        """MCP-4, MCP-7, MCP-8, MCP-9, MCP-11: a first turn lists, then calls or asks."""
        self.tally[f"create {server} {approval}"] += 1
        tool = {"type": "mcp", "server_label": "calc", "server_url": self.urls[server]}
        tool["require_approval"] = approval
        status, final = self._post({"model": "sim", "input": "use echo", "tools": [tool]}, stream)
        assert status == 200, final
        chain = Chain(final["id"], tool, server, approval)
        listing = final["output"][0]
        assert listing["type"] == "mcp_list_tools" and listing["server_label"] == "calc"
        assert bool(listing.get("error")) == (server != "live"), listing
        if server == "refused":
            assert "--mcp-allow-hosts" in listing["error"], listing  # MCP-11: never contacted
        self._after(chain, final["output"][1:], approved=None)
        self.chains.append(chain)

    @precondition(lambda self: self._has(pending=True))
    @rule(data=st.data(), answer=st.sampled_from(["approve", "deny"]), stream=st.booleans())
    def answer(self, data: st.DataObject, answer: str, stream: bool) -> None:
        """MCP-9: an approved request runs as an ``mcp_call`` naming it; a denied one fails
        with -32004 and the reason; either way the model samples again."""
        chain = self._pick(data, pending=True)
        assert chain.pending is not None
        self.tally[f"answer {answer}"] += 1
        reply = {"type": "mcp_approval_response", "approval_request_id": chain.pending,
                 "approve": answer == "approve", "reason": "fuzz says no"}  # fmt: skip
        body = {"model": "sim", "input": [reply], "tools": [chain.tool]}
        status, final = self._post({**body, "previous_response_id": chain.last}, stream)
        assert status == 200, final
        request, chain.last, chain.pending = chain.pending, final["id"], None
        self._after(chain, final["output"], approved=(request, answer == "approve"))

    @precondition(lambda self: self._has(pending=True))
    @rule(data=st.data(), mistake=st.sampled_from(["unknown", "none"]))
    def answer_wrongly(self, data: st.DataObject, mistake: str) -> None:
        """MCP-18: an answer to no request is 400 at its id; VAL-5: no answer at all is 400
        ``tool_output_missing``. Either way the request is still pending."""
        chain = self._pick(data, pending=True)
        self.tally[f"answer {mistake}"] += 1
        reply = {"type": "mcp_approval_response", "approval_request_id": "mcpr_unknown",
                 "approve": True}  # fmt: skip
        items = [reply] if mistake == "unknown" else [{"role": "user", "content": "hi"}]
        body = {"model": "sim", "input": items, "tools": [chain.tool]}
        answer = self._post({**body, "previous_response_id": chain.last}, False)
        if mistake == "unknown":
            self._error(answer, "invalid_value", "input[0].approval_request_id")
        else:
            self._error(answer, "tool_output_missing", "input")

    @precondition(lambda self: self._has(pending=False))
    @rule(data=st.data(), stream=st.booleans())
    def go_on(self, data: st.DataObject, stream: bool) -> None:
        """MCP-4: a continuation finds its listing in the context and does not list again."""
        chain = self._pick(data, pending=False)
        self.tally["continue"] += 1
        body = {"model": "sim", "input": "use echo", "tools": [chain.tool]}
        status, final = self._post({**body, "previous_response_id": chain.last}, stream)
        assert status == 200, final
        chain.last = final["id"]
        assert all(item["type"] != "mcp_list_tools" for item in final["output"]), final
        self._after(chain, final["output"], approved=None)

    # ------------------------------------------------------------------ the model
    def _after(
        self, chain: Chain, output: list[dict[str, Any]], approved: tuple[str, bool] | None
    ) -> None:
        """The items after a listing (or the answered request): a call, a request or just
        the model's answer, as the chain's server and policy say."""
        Response.model_validate({**_SKELETON, "output": output})
        kinds = [item["type"] for item in output]
        if approved is not None:
            request, ok = approved
            assert kinds == ["mcp_call", "message"], kinds
            self._call(output[0], ok=ok, request=request)
        elif chain.server != "live":
            assert kinds == ["message"], kinds  # a failed listing offers nothing (MCP-5)
        elif chain.approval == "always":
            assert kinds == ["mcp_approval_request"], kinds
            assert output[0]["name"] == "echo" and output[0]["server_label"] == "calc"
            chain.pending = output[0]["id"]
            self.tally["asked"] += 1
        else:
            assert kinds == ["mcp_call", "message"], kinds
            self._call(output[0], ok=True, request=None)

    def _call(self, call: dict[str, Any], ok: bool, request: str | None) -> None:
        assert call["name"] == "echo" and call.get("approval_request_id") == request, call
        if ok:
            assert call["status"] == "completed" and call["output"].startswith("echo: "), call
        else:
            assert call["status"] == "failed" and call.get("output") is None, call
            assert call["error"]["code"] == -32004 and "fuzz says no" in call["error"]["message"]
        self.tally[f"mcp_call {call['status']}"] += 1


_SKELETON = {"id": "resp_x", "object": "response", "created_at": 0, "model": "sim",
             "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}  # fmt: skip


def _ordered(text: str, tally: Counter[str]) -> dict[str, Any]:
    """ORD-9 over one SSE stream: items do not interleave, each MCP item's events are in its
    order, and the last event is ``response.completed``; answers the final response."""
    events = [json.loads(block.split("data: ", 1)[1]) for block in text.strip().split("\n\n")]
    assert [e["type"] for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[-1]["type"] == "response.completed", events[-1]
    numbers = [e["sequence_number"] for e in events]
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers))), numbers
    per_item: dict[int, list[str]] = {}
    order: list[int] = []
    for event in events[2:-1]:
        index = event["output_index"]
        if not order or order[-1] != index:
            assert index not in per_item, f"item {index} interleaved: {events}"
            order.append(index)
        name = event["type"]
        per_item.setdefault(index, []).append(_SHORT.get(name, name.removeprefix("response.")))
    final: dict[str, Any] = events[-1]["response"]
    assert order == list(range(len(final["output"]))), order
    for index, item in enumerate(final["output"]):
        pattern = ORDER.get(item["type"])
        if item.get("approval_request_id"):
            pattern = APPROVED if item["status"] == "completed" else DENIED
        if pattern is not None:
            seen = " ".join(per_item[index])
            assert pattern.fullmatch(seen), f"{item['type']}: {seen}"
            tally[f"ordered {item['type']}"] += 1
    return final


@contextlib.contextmanager
def mcp_env() -> Iterator[tuple[LiveEnv, dict[str, str]]]:
    env = LiveEnv(EngineConfig(tokens_per_second=0, mcp_allow_hosts="127.0.0.1"))
    stack = contextlib.AsyncExitStack()
    try:
        mcp = env.run(stack.enter_async_context(sdk_server()), timeout=60)
        urls = {
            "live": mcp.url,
            "down": f"http://127.0.0.1:{free_port()}/mcp",  # nothing listens there
            "refused": "http://10.255.255.1/mcp",  # private, not allowed (MCP-10)
        }
        yield env, urls
    finally:
        env.run(stack.aclose(), timeout=30)
        env.close()


@pytest.mark.timeout(timeout_for(120))
def test_mcp_state_machine() -> None:
    with mcp_env() as (env, urls):
        machine = type("McpFuzz", (McpMachine,), {"env": env, "urls": urls, "tally": Counter()})
        run_state_machine_as_test(
            machine,
            settings=settings(max_examples=examples(ci=0.1, deep=0.03), stateful_step_count=8),
        )
        report("McpMachine", machine.runs, machine.tally)
