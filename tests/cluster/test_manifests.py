"""The deployment files that are not run here (CLUSTER-5): the Kubernetes manifests against
Kubernetes' own JSON schemas (``kubernetes-validate`` bundles them: nothing is downloaded),
strictly, plus the drain settings they must agree on; the compose file's HAProxy config is the
same template ``make cluster`` runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from cli.launcher import DEPLOY, balancer_config

K8S_VERSION = "1.37.0"


def _documents() -> list[dict[str, Any]]:
    docs = []
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def _kind(kind: str) -> list[dict[str, Any]]:
    return [d for d in _documents() if d["kind"] == kind]


def test_manifests_match_the_kubernetes_schemas() -> None:
    docs = _documents()
    assert {d["kind"] for d in docs} >= {"Deployment", "Service", "StatefulSet"}
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    broken = _kind("Deployment")[0]
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["periodSeconds"] = "2s"
    with pytest.raises(kubernetes_validate.ValidationError):  # the check does check
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def _flag(args: list[str], name: str) -> float:
    return float(next(a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")))


def test_deployment_drains_within_its_grace() -> None:
    """DRAIN-1, DRAIN-2, DRAIN-5: readiness on /healthz, a preStop pause, a drain delay and a
    shutdown grace that fit in terminationGracePeriodSeconds; one pod at a time, never fewer."""
    (deployment,) = _kind("Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (node,) = pod["containers"]
    assert node["readinessProbe"]["httpGet"]["path"] == "/healthz"
    pause = float(node["lifecycle"]["preStop"]["exec"]["command"][-1])
    needed = pause + _flag(node["args"], "drain-delay") + _flag(node["args"], "shutdown-grace")
    assert pod["terminationGracePeriodSeconds"] > needed
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    (service,) = [s for s in _kind("Service") if s["metadata"]["name"] == "rollout"]
    assert service["spec"]["selector"].items() <= pod_labels(deployment).items()
    redis = next(s for s in _kind("Service") if s["metadata"]["name"] == "rollout-redis")
    assert f"--store=redis://rollout-redis:{redis['spec']['ports'][0]['port']}/0" in node["args"]


def pod_labels(deployment: dict[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = deployment["spec"]["template"]["metadata"]["labels"]
    return labels


def test_compose_runs_the_cluster_template() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    nodes = sorted(name for name in services if name.startswith("node"))
    assert nodes == ["node0", "node1"] and "redis" in services
    for name in nodes:
        command = services[name]["command"]
        assert "--drain-delay" in command
        assert services[name]["stop_signal"] == "SIGTERM"
        # HAProxy routes a turn-state token to the server named after its node (PARK-8)
        assert command[command.index("--node-id") + 1] == name
    rendered = balancer_config(
        "haproxy", "0.0.0.0", 8000, [f"{n}:8000" for n in nodes], Path("/tmp")
    )
    assert (DEPLOY / "haproxy-compose.cfg").read_text() == rendered
