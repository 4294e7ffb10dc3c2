"""NeMo Gym 0.7.0 against the engine, for the tests that run it (TOK-65): its venv
(``make nemo-gym``: ``.tools/nemo-gym-venv``), its ``example_single_tool_call`` rows, the driver
(``tests/support/nemo_gym_driver.py``, run with that venv's Python) and the check of what the
driver printed against what the token server received and sampled (the far side)."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("ROLLOUT_NEMO_GYM_VENV", ROOT / ".tools" / "nemo-gym-venv"))
VENV_PYTHON = VENV / "bin" / "python"
DRIVER = ROOT / "tests" / "support" / "nemo_gym_driver.py"


class Sampled(Protocol):
    """One turn the token server served: the prompt it received, the ids it sampled."""

    prompt: list[int]
    answer: list[int]


def example_rows() -> Path:
    """The environment's own example rows, as the wheel ships them."""
    found = sorted(
        (VENV / "lib").glob(
            "python3*/site-packages/resources_servers/example_single_tool_call/data/example.jsonl"
        )
    )
    assert found, "NeMo Gym's example_single_tool_call data is missing from its venv"
    return found[0]


async def run_rollouts(
    engine_url: str, workdir: Path, *, nudge: bool = False
) -> tuple[list[dict[str, Any]], int]:
    """Every example row through NeMo Gym's ``simple_agent`` and ``openai_model`` against
    ``engine_url`` (``…/v1``): the rollouts the driver printed, and how many rows there were.
    ``nudge``: one more request between rollouts (a balancer's turn-taking shifted by one)."""
    assert VENV_PYTHON.exists(), f"{VENV_PYTHON} is missing: `make nemo-gym` (make unit) makes it"
    rows = example_rows()
    proc = await asyncio.create_subprocess_exec(
        str(VENV_PYTHON),
        "-P",  # not the driver's folder first: tests/support/http.py would shadow http
        str(DRIVER),
        engine_url,
        str(rows),
        *(["--nudge"] if nudge else []),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=workdir,  # NeMo Gym's hydra writes outputs/<date>/<time>/ where it runs
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()[-4000:]
    rollouts = [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]
    expected = sum(1 for line in rows.read_text().splitlines() if line.strip())
    return rollouts, expected


def assert_token_exact(rollouts: list[dict[str, Any]], turns: Sequence[Sampled]) -> None:
    """TOK-65: every rollout has reward 1.0 and one chain in NeMo Gym's builder; each model
    call's fields are, in order, the prompt the token server received and the ids and as many
    logprobs as it sampled; each call's prompt begins with the previous prompt and generation;
    and the server served no turn beyond these."""
    seen = iter(turns)
    for rollout in rollouts:
        assert rollout["reward"] == 1.0, rollout
        assert rollout["chains"] == 1 and not rollout["quarantined"], rollout
        assert not rollout["unresolved"] and not rollout["link_failures"], rollout
        assert len(rollout["calls"]) == 2  # the call, then the answer after the tool's output
        for call in rollout["calls"]:
            turn = next(seen)  # the far side: what the server received and sampled, in order
            assert call["prompt_token_ids"] == turn.prompt
            assert call["generation_token_ids"] == turn.answer
            assert len(call["generation_log_probs"]) == len(turn.answer)
        second, first = rollout["calls"][1], rollout["calls"][0]
        head = first["prompt_token_ids"] + first["generation_token_ids"]
        assert second["prompt_token_ids"][: len(head)] == head
    assert next(seen, None) is None
