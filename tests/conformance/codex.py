"""The Codex CLI builds and their configuration for a run against a live server (used by
``test_codex_cli.py``, ``test_codex_newest.py`` and ``measure_codex.py``): the pinned one and the
newest on npm when it was last checked (CODEX-20), each installed by ``.ci/sysdeps``."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

from engine.server.routes import v1_responses as http_routes
from engine.server.transport import ws as ws_driver
from engine.server.transport.keys import SESSIONS
from tests.support.oracle import RECORDED
from tests.support.server import LiveServer
from tests.support.wait import wait_for

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class CodexBuild:
    """One installed Codex CLI: its npm version and the folder `.ci/sysdeps` puts it in."""

    version: str
    folder: str

    @property
    def binary(self) -> Path:
        return ROOT / ".tools" / self.folder / "node_modules" / ".bin" / "codex"


PINNED = CodexBuild("0.169.0", "codex")
NEWEST = CodexBuild("0.171.0", "codex-newest")  # `npm view @openai/codex version`, 2026-12-02
CODEX = PINNED.binary
CODEX_VERSION = PINNED.version


MARKER = "marker-7f3a.txt"  # a file in the work dir that only `ls` can reveal


PROMPT = "Use exec_command to list the files, and get_goal to see the current goal."


KEY_ENV = "ROLLOUT_CODEX_TEST_KEY"


def codex_binary(build: CodexBuild = PINNED) -> Path:
    """An installed Codex CLI, or a test failure that says how to get it (no skip)."""
    binary = build.binary
    if not binary.exists():
        pytest.fail(
            f"Codex CLI not found at {binary}: `make test` installs @openai/codex@{build.version}"
            " there with .ci/sysdeps (npm); run `bash .ci/sysdeps`."
        )
    version = subprocess.run(
        [str(binary), "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    if build.version not in version.stdout:
        pytest.fail(f"Codex CLI {build.version} expected, found {version.stdout!r}")
    return binary


# A model catalog entry for `sim` (Codex 0.169's schema) whose `apply_patch` is the freeform
# (custom) tool. Without it Codex falls back to generic metadata, which offers no apply_patch.
CATALOG_ENTRY: dict[str, Any] = {
    "slug": "sim",
    "display_name": "sim",
    "description": "rollout engine simulator",
    "supports_reasoning_summaries": False,
    "support_verbosity": False,
    "default_verbosity": None,
    "apply_patch_tool_type": "freeform",
    "input_modalities": ["text"],
    "truncation_policy": {"mode": "tokens", "limit": 10000},
    "supports_parallel_tool_calls": True,
    "context_window": 128000,
    "reasoning_summary_format": "none",
    "default_reasoning_level": None,
    "supported_reasoning_levels": [],
    "shell_type": "unified_exec",
    "visibility": "list",
    "minimal_client_version": "0.0.1",
    "supported_in_api": True,
    "upgrade": None,
    "priority": 0,
    "base_instructions": "You are a coding agent.",
    "experimental_supported_tools": [],
}


@dataclass
class CodexTask:
    prompt: str = PROMPT
    sandbox: str = "read-only"
    freeform_patch: bool = False  # a model catalog that offers apply_patch as a custom tool
    settings: str = ""  # more top-level config.toml settings
    provider_name: str = "rollout engine"
    build: CodexBuild = PINNED  # which installed Codex runs the task
    tables: str = ""  # more config.toml tables, after the provider's (an `[mcp_servers.x]`)
    # Sign Codex in with ChatGPT tokens (an auth.json) instead of an API key, used by the
    # provider through `requires_openai_auth`: with the provider named "OpenAI", Codex then
    # zstd-compresses its HTTP request bodies as it does for its own backend (HTTP-10).
    chatgpt_auth: bool = False


def write_config(home: Path, base_url: str, websockets: bool, task: CodexTask) -> None:
    """A model provider pointing at the server. The update check, analytics, feedback and the
    plugin/app/model-catalog syncs are off: each would otherwise reach the internet."""
    home.mkdir()
    catalog = ""
    if task.freeform_patch:
        (home / "models.json").write_text(json.dumps({"models": [CATALOG_ENTRY]}))
        catalog = f'model_catalog_json = "{home / "models.json"}"\n'
    (home / "config.toml").write_text(
        catalog
        + ('cli_auth_credentials_store = "file"\n' if task.chatgpt_auth else "")
        + task.settings
        + f"""model = "sim"
model_provider = "rollout"
approval_policy = "never"
sandbox_mode = "{task.sandbox}"
check_for_update_on_startup = false

[analytics]
enabled = false

[feedback]
enabled = false

[features]
plugins = false
remote_plugin = false
remote_models = false
apps = false

[model_providers.rollout]
name = "{task.provider_name}"
base_url = "{base_url}"
{_auth(home, task)}
wire_api = "responses"
supports_websockets = {str(websockets).lower()}
"""
        + task.tables
    )


def _jwt(claims: dict[str, Any]) -> str:
    """An unsigned JWT: Codex reads a ChatGPT token's claims, it does not verify them."""

    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part(claims)}.c2ln"


def _auth(home: Path, task: CodexTask) -> str:
    """The provider's auth: the API key's env var, or (``chatgpt_auth``) the ChatGPT tokens
    of an auth.json, good for a day, so Codex has nothing to refresh."""
    if not task.chatgpt_auth:
        return f'env_key = "{KEY_ENV}"'
    expires = int(time.time()) + 86400
    account = {"chatgpt_account_id": "acct_rollout", "chatgpt_plan_type": "pro"}
    claims = {"email": "codex@example.com", "exp": expires, "https://api.openai.com/auth": account}
    tokens = {
        "id_token": _jwt(claims),
        "access_token": _jwt({"exp": expires, "https://api.openai.com/auth": account}),
        "refresh_token": "rt_rollout",
        "account_id": "acct_rollout",
    }
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    auth = {"auth_mode": "chatgpt", "OPENAI_API_KEY": None, "tokens": tokens, "last_refresh": now}
    (home / "auth.json").write_text(json.dumps(auth))
    return "requires_openai_auth = true"


class ProxyTrap:
    """A TCP listener set as every proxy Codex could use: any outbound attempt lands here."""

    def __init__(self) -> None:
        self.attempts: list[bytes] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.attempts.append(await reader.read(200))
        writer.close()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


@dataclass
class CodexExit:
    """What one ``codex exec`` left behind, whatever server it ran against."""

    returncode: int
    answer: str
    stderr: str
    proxy_attempts: list[bytes]


async def exec_codex(
    base_url: str, tmp_path: Path, websockets: bool, task: CodexTask | None = None
) -> CodexExit:
    """``codex exec`` against ``base_url`` (a live server, or a balancer in front of nodes),
    with the internet trapped; the server side is the caller's to observe."""
    task = task or CodexTask()
    binary = codex_binary(task.build)
    home, work = tmp_path / "codex-home", tmp_path / "work"
    write_config(home, base_url, websockets, task)
    work.mkdir()
    (work / MARKER).write_text("hello\n")
    trap = ProxyTrap()
    proxy = f"http://127.0.0.1:{await trap.start()}"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "CODEX_HOME": str(home),
        KEY_ENV: "dummy-key",
        **dict.fromkeys(("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY"), proxy),
        **{name.lower(): proxy for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY")},
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }
    last = tmp_path / "answer.txt"
    args = ["exec", "--skip-git-repo-check", "--color", "never", "-o", str(last), task.prompt]
    proc = await asyncio.create_subprocess_exec(
        str(binary),
        *args,
        cwd=work,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        _, stderr = await asyncio.wait_for(proc.communicate(), timeout=150)
    finally:
        if proc.returncode is None:
            proc.kill()
        await trap.stop()
    return CodexExit(
        returncode=proc.returncode or 0,
        answer=last.read_text() if last.exists() else "",
        stderr=stderr.decode(errors="replace"),
        proxy_attempts=trap.attempts,
    )


class RequestLog:
    """Records each request body the server decodes (observation only: decoding is unchanged),
    so a test can check what Codex sent."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.bodies: list[dict[str, Any]] = []
        for module, name in (
            (ws_driver, "decode_client_event"),
            (http_routes, "decode_create_body"),
        ):
            monkeypatch.setattr(module, name, self._recording(getattr(module, name)))

    def _recording(self, decode: Any) -> Any:
        def recorded(data: bytes | str, *rest: Any) -> Any:  # rest: the connection's Repeats
            self.bodies.append(msgspec.json.decode(data))
            return decode(data, *rest)

        return recorded


@dataclass
class CodexRun:
    returncode: int
    answer: str
    stderr: str
    frames: list[dict[str, Any]]
    counters: Counter[str]
    stage_items: Counter[str]
    proxy_attempts: list[bytes]
    requests: list[dict[str, Any]]


async def run_codex(
    server: LiveServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    websockets: bool,
    task: CodexTask | None = None,
) -> CodexRun:
    requests = RequestLog(monkeypatch)
    counters_before = Counter(server.engine.counters)
    items_before = Counter(server.engine.stats.items)
    start = len(RECORDED)
    done = await exec_codex(server.base_url, tmp_path, websockets, task)
    # The server's bookkeeping for the last response (its rollout's stats, WS-12) is done once
    # its sockets are closed and no rollout coroutine is left.
    sessions = server.runner.app[SESSIONS]
    await wait_for(lambda: not sessions and not _live_rollouts(), "the last rollout to end")
    return CodexRun(
        returncode=done.returncode,
        answer=done.answer,
        stderr=done.stderr,
        frames=[msgspec.json.decode(raw) for raw in RECORDED[start:]],
        counters=Counter(server.engine.counters) - counters_before,
        stage_items=Counter(server.engine.stats.items) - items_before,
        proxy_attempts=done.proxy_attempts,
        requests=requests.bodies,
    )


def _live_rollouts() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("rollout_")]


def assert_clean(run: CodexRun, caplog: pytest.LogCaptureFixture) -> None:
    """Exit 0, a final answer built from both tools' outputs, no error anywhere, no internet."""
    assert MARKER in run.answer, run.answer  # exec_command ran `ls` in the work dir
    assert '"goal":null' in run.answer, run.answer  # get_goal ran too
    assert_no_error(run, caplog)


def assert_no_error(run: CodexRun, caplog: pytest.LogCaptureFixture) -> None:
    assert run.returncode == 0, run.stderr[-3000:]
    assert not [f for f in run.frames if f["type"] == "error"]
    assert not [f for f in run.frames if f["type"] == "response.failed"]
    noisy = [r for r in caplog.records if r.name.startswith("rollout") and r.levelno >= 30]
    assert not noisy, [r.getMessage() for r in noisy]
    assert run.proxy_attempts == []  # Codex never tried to reach the internet


def responses(run: CodexRun) -> list[dict[str, Any]]:
    return [f["response"] for f in run.frames if f["type"] == "response.completed"]
