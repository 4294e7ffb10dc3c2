"""NeMo Gym 0.7.0 through ``make cluster`` (TOK-65, TOK-62): the launcher's own cluster (two
``rollout serve`` nodes, a real redis-server, real HAProxy in front, as ``make cluster`` starts
it) whose one model is a ``tokens`` route with ``training_fields = true`` to one token peer (the
test's vLLM-shaped server, ``tests/upstream/token_peer.py``, which logs every prompt it
receives). NeMo Gym's ``example_single_tool_call`` rollouts go through the balancer unmodified:
its ``simple_agent`` resends the whole history, the carried ids included, with no
``previous_response_id`` and no affinity, so each resend lands on whichever node the balancer
picks and continues from the ids it carries (nothing held on a node is needed)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cli.launcher import Cluster
from tests.cluster.conftest import ROUTED_MODEL as MODEL
from tests.cluster.conftest import node_stats, routed_cluster, tokens_route
from tests.support.nemo_gym import assert_token_exact, run_rollouts
from tests.upstream.token_peer import TokenPeer


@pytest.fixture
async def training_cluster(tmp_path: Path, peer: TokenPeer) -> AsyncIterator[Cluster]:
    """Two nodes behind HAProxy; the route gives every create the training fields (TOK-61)."""
    route = tokens_route(tmp_path, peer, training_fields=True)
    async with routed_cluster(tmp_path, route) as running:
        yield running


@pytest.mark.timeout(300)
async def test_nemo_gym_rollouts_through_the_cluster_are_token_exact(
    training_cluster: Cluster, peer: TokenPeer, tmp_path: Path
) -> None:
    """TOK-65 through ``make cluster``: N of N rollouts, reward 1.0, every call's fields present
    and what the peer received and sampled, NeMo Gym's builder one chain per rollout and
    contiguous; counted at each node (its own ``/debug/stats``), both nodes served model calls
    and both continued a resend from its carried ids (TOK-62), one per rollout in all."""
    # HAProxy takes turns among idle nodes: a rollout's two calls would land on the same two
    # nodes every time; one more request between rollouts (the driver's --nudge) puts every
    # rollout's resend on the node its first call did not use.
    rollouts, expected = await run_rollouts(training_cluster.url, tmp_path, nudge=True)
    assert len(rollouts) == expected > 1
    assert_token_exact(rollouts, peer.turns)
    routes = [stats["backends"][MODEL] for stats in await node_stats(training_cluster)]
    served = [route.get("requests", 0) for route in routes]
    carried = [route.get("render.carried", 0) for route in routes]
    assert sum(served) == len(peer.turns) == 2 * expected and all(served), served
    assert sum(carried) == expected and all(carried), carried
