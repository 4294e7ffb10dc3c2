"""NeMo Gym 0.7.0 against a ``tokens`` route (TOK-65): its ``example_single_tool_call``
environment through its own ``openai_model`` policy server and ``simple_agent``, in its own
venv (``make nemo-gym``: ``.tools/nemo-gym-venv``), against the engine in front of the token
peer (TOK-42). The route sets ``training_fields`` (TOK-61): NeMo Gym's request body is its
own. Every model call's fields must be what the peer received and sampled, and NeMo Gym's own
trajectory builder must chain every call to the one before it (prefix-contiguous)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from tests.upstream.conftest import StartEngine
from tests.upstream.token_peer import TokenPeer, tokens_router

ROOT = Path(__file__).resolve().parents[3]
VENV = Path(os.environ.get("ROLLOUT_NEMO_GYM_VENV", ROOT / ".tools" / "nemo-gym-venv"))
VENV_PYTHON = VENV / "bin" / "python"
DRIVER = ROOT / "tests" / "support" / "nemo_gym_driver.py"


def example_rows() -> Path:
    """The environment's own example rows, as the wheel ships them."""
    found = sorted(
        (VENV / "lib").glob(
            "python3*/site-packages/resources_servers/example_single_tool_call/data/example.jsonl"
        )
    )
    assert found, "NeMo Gym's example_single_tool_call data is missing from its venv"
    return found[0]


@pytest.mark.timeout(300)
async def test_nemo_gym_rollouts_are_token_exact(
    engine_for: StartEngine, token_peer: TokenPeer, tokenizer_dir: Path, tmp_path: Path
) -> None:
    """TOK-65 (TOK-60, TOK-61, TOK-62): N of N rollouts complete with reward 1.0; each model
    call's ``prompt_token_ids`` is exactly the prompt the peer received, its
    ``generation_token_ids`` and logprobs what the peer sampled; NeMo Gym's ``prefix_merging``
    builder keeps one chain per rollout with no quarantined call and no unresolved parent."""
    assert VENV_PYTHON.exists(), f"{VENV_PYTHON} is missing: `make nemo-gym` (make unit) makes it"
    router = tokens_router(token_peer, tokenizer_dir, "vllm", training_fields=True)
    server = await engine_for(router)
    rows = example_rows()
    proc = await asyncio.create_subprocess_exec(
        str(VENV_PYTHON),
        "-P",  # not the driver's folder first: tests/support/http.py would shadow http
        str(DRIVER),
        server.base_url,
        str(rows),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=tmp_path,  # NeMo Gym's hydra writes outputs/<date>/<time>/ where it runs
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()[-4000:]
    rollouts = [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]
    expected = sum(1 for line in rows.read_text().splitlines() if line.strip())
    assert len(rollouts) == expected > 0
    seen = iter(token_peer.turns)
    for rollout in rollouts:
        assert rollout["reward"] == 1.0, rollout
        assert rollout["chains"] == 1 and not rollout["quarantined"], rollout
        assert not rollout["unresolved"] and not rollout["link_failures"], rollout
        assert len(rollout["calls"]) == 2  # the call, then the answer after the tool's output
        for call in rollout["calls"]:
            turn = next(seen)  # the far side: what the peer received and sampled, in order
            assert call["prompt_token_ids"] == turn.prompt
            assert call["generation_token_ids"] == turn.answer
            assert len(call["generation_log_probs"]) == len(turn.answer)
        second, first = rollout["calls"][1], rollout["calls"][0]
        head = first["prompt_token_ids"] + first["generation_token_ids"]
        assert second["prompt_token_ids"][: len(head)] == head
    assert next(seen, None) is None
