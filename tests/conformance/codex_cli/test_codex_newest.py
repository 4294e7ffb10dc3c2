"""The newest Codex CLI on npm (``NEWEST`` in ``codex.py``, installed beside the pinned one by
``.ci/sysdeps``) runs the same two-tool task over WebSocket and over HTTP (CODEX-20, CODEX-1..3),
and reads what the server now tells it: the upgrade headers and the turn state (CODEX-21..23)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.conformance.codex import (
    MARKER,
    NEWEST,
    CodexTask,
    assert_clean,
    assert_no_error,
    responses,
    run_codex,
)
from tests.support.mcp import sdk_server
from tests.support.server import LiveServer

MCP_PROMPT = "Use weather to see the weather in Paris."


@pytest.mark.timeout(240)
@pytest.mark.parametrize("websockets", [True, False], ids=["ws", "http"])
async def test_newest_codex_runs_the_two_tool_task(
    server: LiveServer,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    websockets: bool,
) -> None:
    """CODEX-20, CODEX-1..CODEX-3: exit 0, an answer built from both tools' outputs (`ls` and
    `get_goal`, called in parallel), no error frame, no failed response, no warning in the
    server log, no attempt to reach the internet; over WebSocket one socket carries the task."""
    caplog.set_level(logging.INFO)
    task = CodexTask(build=NEWEST)
    run = await run_codex(server, tmp_path, monkeypatch, websockets=websockets, task=task)
    assert_clean(run, caplog)
    assert run.counters["ws.connections"] == (1 if websockets else 0)
    calls = [i for r in responses(run) for i in r["output"] if i["type"] == "function_call"]
    assert {c["name"] for c in calls} == {"exec_command", "get_goal"}
    outputs = [i for r in run.requests for i in r["input"] if i["type"] == "function_call_output"]
    assert {o["call_id"] for o in outputs} == {c["call_id"] for c in calls}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("websockets", [True, False], ids=["ws", "http"])
async def test_newest_codex_sends_its_mcp_servers_as_namespace_tools(
    server: LiveServer,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    websockets: bool,
) -> None:
    """CODEX-29, CODEX-28, TOOL-2: Codex 0.171 with a real MCP server in its own config.toml
    (the mcp SDK's, Streamable HTTP) sends that server's tools as a `namespace` tool
    `mcp__weather` beside `multi_agent_v1` and `web_search`; the engine accepts them as sent
    (each Response echoes the namespace unchanged), the simulator calls `weather` in its
    namespace, Codex runs it on the MCP server (counted there, once) and the run completes."""
    caplog.set_level(logging.INFO)
    async with sdk_server() as mcp:
        tables = (
            f'\n[mcp_servers.weather]\nurl = "{mcp.url}"\n'
            'default_tools_approval_mode = "approve"\n'  # `codex exec` asks no one
        )
        task = CodexTask(MCP_PROMPT, build=NEWEST, tables=tables)
        run = await run_codex(server, tmp_path, monkeypatch, websockets=websockets, task=task)
        called = await mcp.calls()
    assert_no_error(run, caplog)
    first = run.requests[0]
    sent = {t["name"]: t for t in first["tools"] if t["type"] == "namespace"}
    assert {"mcp__weather", "multi_agent_v1"} <= set(sent)
    assert "web_search" in {t["type"] for t in first["tools"]}
    inner = {t["name"] for t in sent["mcp__weather"]["tools"]}
    assert {"add", "echo", "weather"} <= inner
    for response in responses(run):  # accepted as Codex sent it, every turn
        echoed = [t for t in response["tools"] if t.get("name") == "mcp__weather"]
        assert echoed == [sent["mcp__weather"]]
    calls = [i for r in responses(run) for i in r["output"] if i["type"] == "function_call"]
    assert [(c.get("namespace"), c["name"]) for c in calls] == [("mcp__weather", "weather")]
    assert called == {"weather": 1}  # at the far side: Codex ran it once
    assert "sunny in" in run.answer, run.answer
    assert run.counters["ws.connections"] == (1 if websockets else 0)


@pytest.mark.timeout(240)
async def test_newest_codex_zstd_compresses_its_bodies_for_the_openai_provider(
    server: LiveServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CODEX-30, HTTP-10: signed in with ChatGPT tokens (an auth.json, used by the provider
    through `requires_openai_auth`) and with its provider named "OpenAI", Codex 0.171
    zstd-compresses every HTTP request body (`enable_request_compression`, on by default).
    Every create reached the engine compressed (counted by the body reader), decoded, and the
    two-tool task completed. Codex's own calls to its ChatGPT backend are trapped, never sent."""
    task = CodexTask(build=NEWEST, provider_name="OpenAI", chatgpt_auth=True)
    run = await run_codex(server, tmp_path, monkeypatch, websockets=False, task=task)
    assert run.returncode == 0, run.stderr[-3000:]
    assert MARKER in run.answer and '"goal":null' in run.answer, run.answer
    assert not [f for f in run.frames if f["type"] in ("error", "response.failed")]
    assert len(run.requests) == 2  # the tool round trip, resent statelessly
    assert run.counters["http.content_encoding.zstd"] == len(run.requests)
    assert all(a.startswith(b"CONNECT chatgpt.com:443 ") for a in run.proxy_attempts)
