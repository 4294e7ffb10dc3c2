"""Closed by default (issue 24 §4): a node reachable from elsewhere refuses to start without keys
(AUTH-10), the shipped deployments require the key secret, what shows every tenant's figures
answers operator keys only (AUTH-11), and no key reaches a log (AUTH-12, AUTH-13).

The servers are real ``rollout serve`` processes; the log checked is their own stderr."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.support.server import stdout_port

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
KEY, ADMIN = "sk-closed-tenant", "sk-closed-operator"
PROBE = "sk-probe-4f1c9a7e"  # a key a client puts where it does not belong


def _serve(*flags: str, env: dict[str, str] | None = None) -> Any:
    return asyncio.create_subprocess_exec(
        sys.executable, "-m", "cli", "serve", "--port", "0", "--announce-port", "--tps", "0",
        "--store", "memory://", *flags,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "ROLLOUT_API_KEYS": "", "ROLLOUT_ADMIN_KEYS": "", **(env or {})},
    )  # fmt: skip


async def _stop(proc: asyncio.subprocess.Process) -> str:
    """SIGTERM, then everything it wrote to stderr (its log)."""
    proc.send_signal(signal.SIGTERM)
    _, err = await asyncio.wait_for(proc.communicate(), 120)
    return err.decode()


async def test_a_non_loopback_node_without_keys_refuses_to_start() -> None:
    proc = await _serve("--host", "0.0.0.0")
    _, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 2
    assert "refusing to listen on 0.0.0.0 without API keys" in err.decode()
    assert "--allow-anonymous" in err.decode()


@pytest.mark.parametrize(
    ("flags", "env"),
    [
        (("--allow-anonymous",), {}),  # told so, it starts, with a warning
        ((), {"ROLLOUT_API_KEYS": KEY}),  # with keys it starts
    ],
)
async def test_told_or_keyed_it_starts(flags: tuple[str, ...], env: dict[str, str]) -> None:
    proc = await _serve("--host", "0.0.0.0", *flags, env=env)
    port = await stdout_port(proc)
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/healthz") as r:
        assert r.status == 200
    log = await _stop(proc)
    assert ("--allow-anonymous" in log) == bool(flags)


def test_the_deployments_require_the_key_secret() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    for name in ("node0", "node1"):
        keys = compose["services"][name]["environment"]["ROLLOUT_API_KEYS"]
        assert keys.startswith("${ROLLOUT_API_KEYS:?")  # compose refuses to start unset
    deployment = next(yaml.safe_load_all((DEPLOY / "k8s" / "rollout.yaml").read_text()))
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    [env] = [e for e in container["env"] if e["name"] == "ROLLOUT_API_KEYS"]
    assert env["valueFrom"]["secretKeyRef"].get("optional", False) is False


@pytest.fixture
async def keyed_node() -> AsyncIterator[tuple[int, asyncio.subprocess.Process]]:
    proc = await _serve(
        "--bench-timings", env={"ROLLOUT_API_KEYS": KEY, "ROLLOUT_ADMIN_KEYS": ADMIN}
    )
    try:
        yield await stdout_port(proc), proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_no_key_reaches_the_log(keyed_node: tuple[int, asyncio.subprocess.Process]) -> None:
    """AUTH-12: keys in query strings, a Referer, a refused bearer, a login form: none in the
    log, though every request is in it."""
    port, proc = keyed_node
    base = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as http:
        for url in (f"{base}/inspect?key={PROBE}", f"{base}/v1/models?api_key={PROBE}"):
            async with http.get(url, headers={"Referer": f"{base}/inspect?key={PROBE}"}) as r:
                assert r.status == 401
        bearer = {"Authorization": f"Bearer {PROBE}"}
        async with http.get(f"{base}/v1/models", headers=bearer) as r:
            assert r.status == 401
        login, origin = f"{base}/inspect/login", {"Origin": base}  # its own page (AUTH-13)
        async with http.post(login, data={"key": PROBE}, headers=origin) as r:
            assert r.status == 401
        async with http.post(login, data={"key": KEY}, headers=origin, allow_redirects=False) as r:
            assert r.status == 303  # signed in: sent to the page with the cookie
    log = await _stop(proc)
    assert '"GET /v1/models HTTP/1.1" 401' in log  # the access log is on and has the requests
    assert '"POST /inspect/login HTTP/1.1" 303' in log
    assert PROBE not in log and KEY not in log


@pytest.mark.parametrize("path", ["/metrics", "/debug/stats", "/v1/bench/timings"])
async def test_every_tenants_figures_need_an_operator_key(
    keyed_node: tuple[int, asyncio.subprocess.Process], path: str
) -> None:
    """AUTH-11: a tenant's key is refused (403), an operator's answered."""
    port, _ = keyed_node
    url = f"http://127.0.0.1:{port}{path}"
    async with aiohttp.ClientSession() as http:
        async with http.get(url, headers={"Authorization": f"Bearer {KEY}"}) as r:
            assert r.status == 403
            assert (await r.json())["error"]["code"] == "operator_key_required"
        async with http.get(url) as r:
            assert r.status == 401
        async with http.get(url, headers={"Authorization": f"Bearer {ADMIN}"}) as r:
            assert r.status == 200
