"""Fixtures (CLUSTER-TEST-1): the launcher's own ``Cluster`` (``cli/launcher.py``, the code behind
``make cluster``) in a temp dir: a real redis-server, real ``rollout serve`` node processes and a
real HAProxy or nginx in front, each on an ephemeral loopback port, all stopped at teardown."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from cli.launcher import Cluster, ClusterSpec, free_port, node_id
from tests.support.fixtures import started
from tests.upstream.token_peer import TokenPeer, make_tokenizer

# Keyed clusters: two tenants and an operator key, given to the nodes through
# their environment, never on a command line.
KEYS = ("key-a", "key-b")
OPERATOR = "key-operator"
KEYS_ENV, OPERATOR_ENV = "ROLLOUT_CLUSTER_TEST_KEYS", "ROLLOUT_CLUSTER_TEST_ADMIN"


def cluster_spec(
    tmp_path: Path, balancer: str, *serve_args: str, keyed: bool = False
) -> ClusterSpec:
    keys = ["--api-keys-env", KEYS_ENV, "--admin-keys-env", OPERATOR_ENV] if keyed else []
    env = {**os.environ, KEYS_ENV: ",".join(KEYS), OPERATOR_ENV: OPERATOR} if keyed else None
    return ClusterSpec(
        nodes=2, port=0, store=f"redis://127.0.0.1:{free_port()}/0", balancer=balancer,
        workdir=tmp_path / "cluster", drain_delay_s=1.5, env=env,  # > 2 checks (DRAIN-2, RETRY-3)
        serve_args=["--tps", "0", *(keys or ["--api-keys-env", ""]), *serve_args],
    )  # fmt: skip


ROUTED_MODEL = "model-a"  # the one model of a routed cluster's --config


@contextlib.asynccontextmanager
async def routed_cluster(
    tmp_path: Path, route: dict[str, Any], *, keyed: bool = False
) -> AsyncIterator[Cluster]:
    """Two nodes behind HAProxy whose one model, ``ROUTED_MODEL``, is ``route`` (a
    ``--config`` models table: a ``tokens`` route to a peer, say)."""
    config = tmp_path / "models.toml"
    lines = [f'default = "{ROUTED_MODEL}"', f'[models."{ROUTED_MODEL}"]']
    lines += [f"{key} = {json.dumps(value)}" for key, value in route.items()]
    config.write_text("\n".join(lines) + "\n")
    async with started(
        Cluster(cluster_spec(tmp_path, "haproxy", "--config", str(config), keyed=keyed))
    ) as running:
        yield running


@pytest.fixture
async def peer(tmp_path: Path) -> AsyncIterator[TokenPeer]:
    """A token server (its tokenizer trained into ``tmp_path / "tok"``) that logs each prompt."""
    async with started(TokenPeer(make_tokenizer(tmp_path / "tok"))) as running:
        yield running


def tokens_route(tmp_path: Path, peer: TokenPeer, **extra: Any) -> dict[str, Any]:
    """A ``tokens`` route to ``peer`` with the tokenizer the ``peer`` fixture trained."""
    return {"backend": "tokens", "api": "vllm", "base_url": peer.base_url, "model": "tiny",
            "tokenizer": str(tmp_path / "tok"), **extra}  # fmt: skip


@pytest.fixture(params=["haproxy", "nginx"])
async def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Cluster]:
    """Both balancers in turn, in front of two nodes sharing one redis-server."""
    async with started(Cluster(cluster_spec(tmp_path, request.param))) as running:
        yield running


@pytest.fixture(params=["haproxy", "nginx"])
async def keyed_cluster(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Cluster]:
    """Both balancers in turn, in front of two nodes that require API keys (KEYS, OPERATOR)."""
    async with started(Cluster(cluster_spec(tmp_path, request.param, keyed=True))) as running:
        yield running


@pytest.fixture
async def haproxy_cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with started(Cluster(cluster_spec(tmp_path, "haproxy"))) as running:
        yield running


# Open nodes ignore it; keyed ones answer their stats to the operator (AUTH-4).
OPERATOR_HEADERS = {"Authorization": f"Bearer {OPERATOR}"}


async def node_counters(cluster: Cluster) -> list[dict[str, Any]]:
    """Each node's own engine counters (``/debug/stats`` straight from the node, HTTP-7); a
    stopped node's are empty."""
    out: list[dict[str, Any]] = []
    async with aiohttp.ClientSession() as http:
        for node in cluster.nodes:
            if node.proc is None:
                out.append({})
                continue
            url = f"http://127.0.0.1:{node.port}/debug/stats"
            async with http.get(url, headers=OPERATOR_HEADERS) as resp:
                out.append((await resp.json())["counters"])
    return out


async def node_stats(cluster: Cluster) -> list[dict[str, Any]]:
    """Each running node's whole ``/debug/stats`` (HTTP-7: counters, ``parked``); a stopped
    node's is empty."""
    out: list[dict[str, Any]] = []
    async with aiohttp.ClientSession() as http:
        for node in cluster.nodes:
            if node.proc is None:
                out.append({})
                continue
            url = f"http://127.0.0.1:{node.port}/debug/stats"
            async with http.get(url, headers=OPERATOR_HEADERS) as resp:
                out.append(await resp.json())
    return out


def node_url(cluster: Cluster, index: int) -> str:
    """Node ``index`` straight, bypassing the balancer (a client whose reconnect landed there)."""
    return f"http://127.0.0.1:{cluster.nodes[index].port}/v1"


def via(index: int) -> dict[str, str]:
    """Headers that send a request through the balancer to node ``index``: a turn-state token
    naming it (TURN-1, CLUSTER-11), the way a client whose connection landed there is served."""
    return {"x-codex-turn-state": f"rts1.{node_id(index)}.{'0' * 32}"}
