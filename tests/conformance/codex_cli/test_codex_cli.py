"""The Codex CLI (``@openai/codex``, pinned by ``.ci/sysdeps``) as a real client (CODEX-1..CODEX-3).

``codex exec`` runs a two-tool task against a live server with the simulated model, once over
WebSocket and once over HTTP: the simulator calls Codex's ``exec_command`` (with ``ls``) and
``get_goal`` in parallel, Codex runs both, and the simulator answers from their outputs. The
work directory holds a file only ``ls`` can reveal, so the final answer proves the round trip.
A recording proxy in the environment catches any attempt of Codex to reach the internet.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from engine.conversation.compaction import unseal
from engine.core import EngineConfig
from engine.server.transport.server_config import ServerConfig
from tests.conformance.codex import (
    CodexTask,
    assert_clean,
    assert_no_error,
    responses,
    run_codex,
)
from tests.support.server import LiveServer


@pytest.mark.timeout(240)
async def test_codex_exec_over_websocket(
    server: LiveServer,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CODEX-1, CODEX-2, TOOL-1, TOOL-2, TOOL-4, SIM-7: one socket for the whole task; a
    prewarm (`generate: false`), then creates chained by `previous_response_id` whose new
    items go through the incremental path; the tool outputs resume the suspended rollout."""
    caplog.set_level(logging.INFO)
    run = await run_codex(server, tmp_path, monkeypatch, websockets=True)
    assert_clean(run, caplog)
    assert run.counters["ws.connections"] == 1
    # TURN-2, CODEX-6: the one handshake issued the turn's token; no second handshake echoes it.
    assert run.counters["turn_state.issued"] == 1
    done = responses(run)
    prewarm, turns = done[0], done[1:]
    assert prewarm["output"] == [] and prewarm["usage"]["output_tokens"] == 0
    assert {t["type"] for t in prewarm["tools"]} >= {"function", "namespace", "web_search"}
    # The prewarm came first; each later create names the previous response and carries only
    # items the server has not seen: together they are the whole conversation, sent once.
    first, *chained = run.requests
    assert first["generate"] is False and "previous_response_id" not in first
    assert [r["previous_response_id"] for r in chained] == [r["id"] for r in done[:-1]]
    sent = [json_of(i) for r in run.requests for i in r["input"]]
    assert len(sent) == len(set(sent))
    # Only the prewarm ran the full pipeline; the rest went through the incremental paths.
    assert run.counters["create.stateless"] == 1
    assert run.stage_items["validate.full"] == len(first["input"])
    assert run.stage_items["validate.incremental"] == sum(len(r["input"]) for r in chained)
    assert run.counters["create.cache_hit"] == 1  # the turn, chained on the prewarm
    assert run.counters["create.fast_path"] >= 1  # tool outputs resumed the suspended coroutine
    calls = [i for t in turns for i in t["output"] if i["type"] == "function_call"]
    assert {c["name"] for c in calls} == {"exec_command", "get_goal"}
    exec_call = next(c for c in calls if c["name"] == "exec_command")
    assert msgspec.json.decode(exec_call["arguments"]) == {"cmd": "ls"}
    outputs = [i for r in chained for i in r["input"] if i["type"] == "function_call_output"]
    assert {o["call_id"] for o in outputs} == {c["call_id"] for c in calls}


def json_of(item: dict[str, Any]) -> bytes:
    return msgspec.json.encode(item, order="sorted")


@pytest.mark.timeout(240)
async def test_codex_exec_over_http(
    server: LiveServer,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CODEX-1, CODEX-3, CODEX-6: the same task over HTTP/SSE (`supports_websockets = false`):
    Codex resends the history (`store: false`), the server runs it statelessly, no socket opens.
    The first POST's answer issued the turn's `x-codex-turn-state`; Codex sent it back on the
    second POST of the turn (TURN-2)."""
    caplog.set_level(logging.INFO)
    run = await run_codex(server, tmp_path, monkeypatch, websockets=False)
    assert_clean(run, caplog)
    assert run.counters["ws.connections"] == 0
    assert run.counters["create.stateless"] == len(responses(run)) == len(run.requests) == 2
    assert run.counters["turn_state.issued"] == 1
    assert run.counters["turn_state.echoed"] == 1 and run.counters["turn_state.foreign"] == 0
    assert all("previous_response_id" not in r for r in run.requests)
    calls = [i for r in responses(run) for i in r["output"] if i["type"] == "function_call"]
    assert {c["name"] for c in calls} == {"exec_command", "get_goal"}


@pytest.mark.timeout(240)
async def test_codex_apply_patch_is_a_custom_tool_call(
    server: LiveServer,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CODEX-4, TOOL-3, ITEM-9: with a model catalog that gives `sim` the freeform `apply_patch`
    (a `custom` tool), the simulator calls it with a patch; Codex applies the patch in the
    (workspace-write) work dir and answers with a `custom_tool_call_output`, which resumes the
    suspended rollout."""
    caplog.set_level(logging.INFO)
    task = CodexTask("Use apply_patch to add a note about Paris", "workspace-write", True)
    run = await run_codex(server, tmp_path, monkeypatch, websockets=True, task=task)
    assert_no_error(run, caplog)
    assert (tmp_path / "work" / "notes.txt").read_text() == "Paris\n"
    offered = [t for t in run.requests[0]["tools"] if t.get("name") == "apply_patch"]
    assert [t["type"] for t in offered] == ["custom"]
    calls = [i for r in responses(run) for i in r["output"] if i["type"] == "custom_tool_call"]
    assert [c["name"] for c in calls] == ["apply_patch"]
    assert calls[0]["input"].startswith("*** Begin Patch")
    kinds = [f["type"] for f in run.frames]
    assert "response.custom_tool_call_input.delta" in kinds
    assert "response.custom_tool_call_input.done" in kinds
    outputs = [
        i for r in run.requests for i in r["input"] if i["type"] == "custom_tool_call_output"
    ]
    assert [o["call_id"] for o in outputs] == [calls[0]["call_id"]]
    assert run.counters["create.fast_path"] == 1 and run.counters["ws.connections"] == 1
    assert "notes.txt" in run.answer


@pytest.mark.timeout(240)
async def test_codex_falls_back_to_http_on_426(
    server_factory: Callable[..., Any],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """WS-13, CODEX-5, TURN-2: Codex configured for WebSockets (`supports_websockets = true`)
    against a server with WebSocket mode off: the upgrade is answered 426 `websocket_disabled`,
    Codex switches to HTTP/SSE and completes the same task there, statelessly."""
    caplog.set_level(logging.INFO)
    live: LiveServer = await server_factory(server=ServerConfig(websocket_enabled=False))
    run = await run_codex(live, tmp_path, monkeypatch, websockets=True)
    assert_clean(run, caplog)
    assert run.counters["ws.disabled_refusals"] >= 1  # Codex tried the upgrade first
    assert run.counters["ws.connections"] == 0
    assert run.counters["create.stateless"] == len(run.requests) == len(responses(run)) == 2
    assert all("previous_response_id" not in r and "generate" not in r for r in run.requests)
    assert run.counters["turn_state.issued"] == run.counters["turn_state.echoed"] == 1


@pytest.mark.timeout(240)
async def test_codex_remote_compaction_v2(
    server: LiveServer,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """COMPACT-7, CODEX-7: Codex's remote compaction v2. With a tiny auto-compact limit and a
    provider Codex treats as OpenAI (it compacts remotely only for those), Codex compacts
    mid-turn: on the one socket it sends the tool outputs plus a final `compaction_trigger`,
    chained on the fast path. The answer has exactly one output item, the compaction (added,
    `response.compaction.compacting`, done), whose summary stands for the tool round too. Codex
    then continues from its own compacted history (its messages and that item), statelessly."""
    caplog.set_level(logging.INFO)
    task = CodexTask(settings="model_auto_compact_token_limit = 200\n", provider_name="OpenAI")
    run = await run_codex(server, tmp_path, monkeypatch, websockets=True, task=task)
    assert_no_error(run, caplog)
    assert "context compacted" in run.stderr
    assert run.counters["compaction.trigger"] == 1 and run.counters["ws.connections"] == 1
    asks = [r for r in run.requests if r["input"][-1]["type"] == "compaction_trigger"]
    assert len(asks) == 1
    assert [i["type"] for i in asks[0]["input"]][:-1] == ["function_call_output"] * 2
    compacted = next(
        r
        for r in responses(run)
        if r["previous_response_id"] == asks[0].get("previous_response_id")
    )
    assert [o["type"] for o in compacted["output"]] == ["compaction"]
    item = compacted["output"][0]
    summary = unseal(item["encrypted_content"]) or ""  # it stands for the whole tool round
    assert summary.startswith("Summary of 4 earlier items:") and "called exec_command" in summary
    assert '"goal":null' in summary
    first = next(
        n
        for n, f in enumerate(run.frames)
        if f["type"] == "response.created" and f["response"]["id"] == compacted["id"]
    )
    kinds = [f["type"] for f in run.frames[first:]]
    assert kinds[: kinds.index("response.completed") + 1] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.compaction.compacting",
        "response.output_item.done",
        "response.completed",
    ]
    after = run.requests[run.requests.index(asks[0]) + 1]
    assert "previous_response_id" not in after and after["input"][-1] == item


@pytest.mark.timeout(240)
async def test_codex_reads_rate_limits(
    server_factory: Callable[..., Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """RATE-5, RATE-6: an open server whose default allows one response per 2 s window: Codex's
    creates come faster, so some are refused. On its WebSocket Codex hears `codex.rate_limits`
    and then the 429 error event with the `x-ratelimit-*` headers; the socket is not dropped by
    the server, and Codex, retrying, still completes its task."""
    config = ServerConfig(rate_requests=1, rate_window_s=2.0)
    engine = EngineConfig(tokens_per_second=0, park_seconds=0)  # an abandoned turn ends at once
    live: LiveServer = await server_factory(engine, server=config)
    run = await run_codex(live, tmp_path, monkeypatch, websockets=True)
    kinds = [frame["type"] for frame in run.frames]
    errors = [frame for frame in run.frames if frame["type"] == "error"]
    assert errors, "no create was refused: Codex was slower than the window"
    assert all(e["status"] == 429 and e["error"]["code"] == "rate_limit_exceeded" for e in errors)
    assert all(e["headers"]["x-ratelimit-remaining-requests"] == "0" for e in errors)
    first = kinds.index("codex.rate_limits")
    assert kinds[first + 1] == "error"  # the figures, then the refusal (RATE-6)
    assert run.returncode == 0, run.stderr[-3000:]
    assert responses(run)[-1]["status"] == "completed"
