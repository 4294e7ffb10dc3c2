"""``run_demo`` (the ``rollout agent`` command) against a live server and an unreachable one."""

from __future__ import annotations

import io

import pytest

from clients.demo import run_demo, summarize_arguments
from tests.support.server import LiveServer


@pytest.mark.parametrize("mode", ["append", "ws", "http"])
async def test_demo_succeeds_quietly(
    server: LiveServer, mode: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await run_demo(server.base_url, mode=mode, quiet=True) == 0
    out = capsys.readouterr().out
    assert out.startswith("completed: 27 turns, 26 tool calls")
    assert len(out.splitlines()) == 1


async def test_demo_plain_progress_and_summary(
    server: LiveServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await run_demo(server.base_url, mode="append") == 0
    out = capsys.readouterr().out
    assert "   1. list_dir path=. -> " in out
    assert "  26. run_tests target=tests -> " in out
    assert "final answer: All tests pass now." in out
    assert "turns:       27 (1 response(s)" in out
    assert "tool calls:  26 (0 returned errors)" in out
    assert "sandbox:     all BUG markers fixed" in out
    assert "\r" not in out


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


async def test_demo_draws_a_live_bar_on_a_terminal(
    server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    terminal = FakeTerminal()
    monkeypatch.setattr("sys.stdout", terminal)
    assert await run_demo(server.base_url, mode="ws") == 0
    out = terminal.getvalue()
    assert "calls 25 · run_tests target=tests" in out  # the live bar, redrawn per call
    assert "\x1b[" in out  # drawn with cursor control, then erased (transient)
    assert "   1. list_dir" not in out  # no plain per-call lines on a terminal
    assert "final answer: All tests pass now." in out


async def test_demo_reports_unreachable_server(
    unused_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await run_demo(f"http://127.0.0.1:{unused_port}/v1", quiet=True) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot connect to ws://127.0.0.1:{unused_port}/v1/responses")


async def test_demo_rejects_unknown_mode(capsys: pytest.CaptureFixture[str]) -> None:
    assert await run_demo("http://127.0.0.1:1/v1", mode="carrier-pigeon") == 1
    assert "unknown mode 'carrier-pigeon'" in capsys.readouterr().err


def test_summarize_arguments() -> None:
    assert summarize_arguments('{"path": "a.py", "old": "x\\n  y"}') == "path=a.py old=x y"
    assert summarize_arguments("not json", width=5) == "not …"
    assert summarize_arguments('{"k": "' + "z" * 60 + '"}', width=10) == "k=zzzzzzzzz…"
