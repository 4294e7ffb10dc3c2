"""NeMo Gym's own servers against the engine, run in NeMo Gym's venv (TOK-65).

Run by ``tests/upstream/training/test_nemo_gym.py`` with the NeMo Gym venv's Python (NeMo Gym
0.7.0 needs Python 3.13 and its own dependency set), never imported by the suite. It starts
NeMo Gym's ``example_single_tool_call`` resources server, its ``openai_model`` policy server
(pointed at the engine) and its ``simple_agent``, each its own FastAPI app on uvicorn on a
loopback port, wired by NeMo Gym's ``ServerClient`` from a global config the way ``ng_run``
wires them (``ng_run`` itself also builds a uv venv per server and starts Ray, which needs
downloads this test does not make). Then it runs the agent on the example's rows through the
agent's ``/run`` route, builds each rollout's token trajectory with NeMo Gym's own
``token_id_capture`` builder (``prefix_merging``, which verifies each call's parent by digest)
and ``assert_prefix_contiguity``, and prints one JSON line per rollout.

Usage: python -P nemo_gym_driver.py ENGINE_BASE_URL ROWS_JSONL [--nudge]

With ``--nudge`` it asks ``ENGINE_BASE_URL/models`` once after each rollout: behind a balancer
that takes turns (HAProxy's ``leastconn`` among idle nodes), a rollout's two model calls would
otherwise land on the same two nodes in the same order every time; one more request between
rollouts makes every rollout's resend land on the node its first call did not.
"""

# mypy: ignore-errors
from __future__ import annotations

import asyncio
import json
import socket
import sys
import urllib.request
from pathlib import Path

import uvicorn
from nemo_gym.server_utils import BaseServerConfig, ServerClient
from nemo_gym.token_id_capture.builder import (
    assert_prefix_contiguity,
    project_main_chain_response,
    run_builder,
)
from nemo_gym.token_id_capture.records import ParentResolutionStatus, TokenEntry, compute_digest
from omegaconf import OmegaConf
from resources_servers.example_single_tool_call.app import (
    SimpleWeatherResourcesServer,
    SimpleWeatherResourcesServerConfig,
)
from responses_api_agents.simple_agent.app import SimpleAgent, SimpleAgentConfig
from responses_api_models.openai_model.app import SimpleModelServer, SimpleModelServerConfig

FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")


def bound() -> socket.socket:
    """A listening loopback socket on a port of the system's choosing, held from here on (no
    probed port another process could take, CLUSTER-1); connections queue until served."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


def serve(app, sock: socket.socket) -> tuple[uvicorn.Server, asyncio.Task]:
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    return server, asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))


def entries_of(rollout_id: str, calls: list[dict]) -> list[TokenEntry]:
    """Each model call's fields as a capture record, each call resolved to the one before it
    (the record the capture writes at request time; the builder verifies it by digest)."""
    entries: list[TokenEntry] = []
    for n, item in enumerate(calls):
        parent = entries[-1] if entries else None
        entry = TokenEntry(
            rollout_id=rollout_id,
            model_call_id=f"{rollout_id}-call-{n}",
            prompt_token_ids=item["prompt_token_ids"],
            generation_token_ids=item["generation_token_ids"],
            generation_log_probs=item["generation_log_probs"],
            output_items=[item],
            token_item_index=0,
            parent_call_id=parent.model_call_id if parent else None,
            parent_resolution=(
                ParentResolutionStatus.RESOLVED if parent else ParentResolutionStatus.ROOT
            ),
        )
        cumulative = entry.prompt_token_ids + entry.generation_token_ids
        entry.cum_len, entry.digest = len(cumulative), compute_digest(cumulative)
        entries.append(entry)
    return entries


async def main(engine_url: str, rows: list[dict], nudge: bool) -> None:
    sockets = {name: bound() for name in ("model", "resources", "agent")}
    ports = {name: sock.getsockname()[1] for name, sock in sockets.items()}
    head = BaseServerConfig(host="127.0.0.1", port=0)  # nothing here asks the head server
    global_config = OmegaConf.create(
        {
            "head_server": {"host": "127.0.0.1", "port": 0},
            "policy_model": {
                "responses_api_models": {
                    "openai_model": {"host": "127.0.0.1", "port": ports["model"]}
                }
            },
            "example_single_tool_call": {
                "resources_servers": {
                    "example_single_tool_call": {"host": "127.0.0.1", "port": ports["resources"]}
                }
            },
            "example_single_tool_call_simple_agent": {
                "responses_api_agents": {
                    "simple_agent": {"host": "127.0.0.1", "port": ports["agent"]}
                }
            },
        }
    )
    client = ServerClient(head_server_config=head, global_config_dict=global_config)
    model = SimpleModelServer(
        config=SimpleModelServerConfig(
            host="127.0.0.1",
            port=ports["model"],
            entrypoint="app.py",
            name="policy_model",
            openai_base_url=engine_url,
            openai_api_key="nemo-gym",
            openai_model="model-a",
        ),
        server_client=client,
    )
    resources = SimpleWeatherResourcesServer(
        config=SimpleWeatherResourcesServerConfig(
            host="127.0.0.1",
            port=ports["resources"],
            entrypoint="app.py",
            name="example_single_tool_call",
            domain="agent",
        ),
        server_client=client,
    )
    agent = SimpleAgent(
        config=SimpleAgentConfig(
            host="127.0.0.1",
            port=ports["agent"],
            entrypoint="app.py",
            name="example_single_tool_call_simple_agent",
            resources_server={"type": "resources_servers", "name": "example_single_tool_call"},
            model_server={"type": "responses_api_models", "name": "policy_model"},
        ),
        server_client=client,
    )
    apps = {"model": model, "resources": resources, "agent": agent}
    servers = [serve(apps[name].setup_webserver(), sock) for name, sock in sockets.items()]
    try:
        for n, row in enumerate(rows):
            response = await client.post(
                server_name="example_single_tool_call_simple_agent", url_path="/run", json=row
            )
            body = json.loads(await response.read())
            if response.status != 200:
                raise RuntimeError(f"/run answered {response.status}: {body}")
            output = body["response"]["output"]
            calls = [item for item in output if all(f in item for f in FIELDS)]
            built = run_builder(entries_of(f"rollout-{n}", calls))
            projected = project_main_chain_response(f"rollout-{n}", built)
            assert_prefix_contiguity(projected)
            print(
                json.dumps(
                    {
                        "reward": body.get("reward"),
                        "items": len(output),
                        "calls": [{f: item[f] for f in FIELDS} for item in calls],
                        "chains": len(built.chains),
                        "quarantined": built.quarantined,
                        "unresolved": built.notes.unresolved_parent_calls,
                        "link_failures": built.notes.parent_link_failures,
                    }
                ),
                flush=True,
            )
            if nudge:
                await asyncio.to_thread(ask, f"{engine_url}/models")
    finally:
        for server, _ in servers:
            server.should_exit = True
        await asyncio.gather(*(task for _, task in servers))


def ask(url: str) -> None:
    with urllib.request.urlopen(url, timeout=30) as answer:
        answer.read()


if __name__ == "__main__":
    engine, examples = sys.argv[1:3]
    nudge = "--nudge" in sys.argv[3:]
    del sys.argv[1:]  # NeMo Gym reads the command line as Hydra overrides
    lines = Path(examples).read_text().splitlines()
    rows = [json.loads(line) for line in lines if line.strip()]
    asyncio.run(main(engine, rows, nudge))
