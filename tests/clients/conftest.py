"""Fixtures for the client tests: a fresh coding sandbox and the scenario's expectations."""

from __future__ import annotations

from pathlib import Path

import pytest

from clients.coding import make_sandbox, remaining_bugs
from clients.loop import RolloutResult
from engine.models.sim.scenarios import CODING_AGENT_STEPS
from tests.support.server import free_port


@pytest.fixture
def sandbox(tmp_path: Path) -> Path:
    return make_sandbox(tmp_path / "project")


def assert_scenario_completed(result: RolloutResult, root: Path) -> None:
    """The scripted coding agent ran to the end and really fixed the sandbox."""
    assert len(result.tool_calls) == len(CODING_AGENT_STEPS) == 26
    assert [r.name for r in result.tool_calls] == [s.name for s in CODING_AGENT_STEPS]
    assert all(r.ok for r in result.tool_calls), [r.output for r in result.tool_calls if not r.ok]
    assert result.turns == 27
    assert "All tests pass" in result.final_text
    assert remaining_bugs(root) == []
    assert "19 passed" in result.tool_calls[-1].output
    assert "failed" not in result.tool_calls[-1].output
    assert result.usage.input_tokens > 0 and result.usage.output_tokens > 0
    assert result.usage.total_tokens == result.usage.input_tokens + result.usage.output_tokens


@pytest.fixture
def unused_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    return free_port()
