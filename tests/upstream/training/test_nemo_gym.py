"""NeMo Gym 0.7.0 against a ``tokens`` route (TOK-65): its ``example_single_tool_call``
environment through its own ``openai_model`` policy server and ``simple_agent``, in its own
venv (``make nemo-gym``: ``.tools/nemo-gym-venv``), against the engine in front of the token
peer (TOK-42). The route sets ``training_fields`` (TOK-61): NeMo Gym's request body is its
own. Every model call's fields must be what the peer received and sampled, and NeMo Gym's own
trajectory builder must chain every call to the one before it (prefix-contiguous). The same
through a cluster: ``tests/cluster/training/test_nemo_gym_across_nodes.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.nemo_gym import assert_token_exact, run_rollouts
from tests.upstream.conftest import StartEngine
from tests.upstream.token_peer import TokenPeer, tokens_router


@pytest.mark.timeout(300)
async def test_nemo_gym_rollouts_are_token_exact(
    engine_for: StartEngine, token_peer: TokenPeer, tokenizer_dir: Path, tmp_path: Path
) -> None:
    """TOK-65 (TOK-60, TOK-61, TOK-62): N of N rollouts complete with reward 1.0; each model
    call's ``prompt_token_ids`` is exactly the prompt the peer received, its
    ``generation_token_ids`` and logprobs what the peer sampled; NeMo Gym's ``prefix_merging``
    builder keeps one chain per rollout with no quarantined call and no unresolved parent."""
    router = tokens_router(token_peer, tokenizer_dir, "vllm", training_fields=True)
    server = await engine_for(router)
    rollouts, expected = await run_rollouts(server.base_url, tmp_path)
    assert len(rollouts) == expected > 0
    assert_token_exact(rollouts, token_peer.turns)
