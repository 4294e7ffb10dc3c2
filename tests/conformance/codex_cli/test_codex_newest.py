"""The newest Codex CLI on npm (``NEWEST`` in ``codex.py``, installed beside the pinned one by
``.ci/sysdeps``) runs the same two-tool task over WebSocket and over HTTP (CODEX-20, CODEX-1..3),
and reads what the server now tells it: the upgrade headers and the turn state (CODEX-21..23)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.conformance.codex import NEWEST, CodexTask, assert_clean, responses, run_codex
from tests.support.server import LiveServer


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
