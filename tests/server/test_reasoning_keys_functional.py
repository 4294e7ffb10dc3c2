"""``rollout serve --reasoning-key-file`` (SEAL-5): a real ``rollout serve`` process. A file
with a bad key stops it before it listens (exit status 2), naming the file's fault and never
the key; without the flag it starts and warns that sealed reasoning will not survive a restart
or cross nodes; with a good file it starts without that warning. Workers of one port and
the nodes ``rollout cluster`` starts share one key."""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import sys
from pathlib import Path

import aiohttp

from cli.launcher import shared_key_args
from engine.conversation.sealed import KeyRing
from engine.server.process.serve import _workers_key
from tests.support.server import stdout_port


async def _serve(*flags: str) -> asyncio.subprocess.Process:
    args = ["-m", "cli", "serve", "--port", "0", "--announce-port", "--tps", "0"]
    return await asyncio.create_subprocess_exec(
        sys.executable,
        *args,
        "--store",
        "memory://",
        *flags,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "ROLLOUT_API_KEYS": "", "ROLLOUT_ADMIN_KEYS": ""},
    )


async def _started_log(*flags: str) -> str:
    """Start, answer /healthz once, stop: everything it logged."""
    proc = await _serve(*flags)
    port = await stdout_port(proc)
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/healthz") as r:
        assert r.status == 200
    proc.send_signal(signal.SIGTERM)
    _, err = await asyncio.wait_for(proc.communicate(), 120)
    return err.decode()


async def test_a_bad_key_file_stops_serve_without_showing_the_key(tmp_path: Path) -> None:
    bad = "not-a-key-3f9a"
    keys = tmp_path / "keys"
    keys.write_text(f"# rotated keys\n{bad}\n")
    proc = await _serve("--reasoning-key-file", str(keys))
    _, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 2
    assert "a reasoning key is 32 bytes" in err.decode()
    assert bad not in err.decode()


async def test_without_a_key_file_it_warns_and_with_one_it_does_not(tmp_path: Path) -> None:
    assert "--reasoning-key-file" in await _started_log()
    keys = tmp_path / "keys"
    keys.write_text(os.urandom(32).hex() + "\n")
    log = await _started_log("--reasoning-key-file", str(keys))
    assert "reasoning-key-file" not in log and keys.read_text().strip() not in log


def test_workers_and_cluster_nodes_share_one_key(tmp_path: Path) -> None:
    """SEAL-5: without a key file, the workers of one port get one random key file from their
    parent (0600, gone when they stop), and ``rollout cluster`` gives its nodes one kept in
    its workdir (made once, reused on restart); a key file named in the flags wins."""
    with _workers_key(["--port", "0"], ephemeral=True) as argv:
        path = Path(argv[argv.index("--reasoning-key-file") + 1])
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert not KeyRing.from_file(path).ephemeral
    assert not path.exists()
    with _workers_key(["--reasoning-key-file", "k"], ephemeral=False) as argv:
        assert argv == ["--reasoning-key-file", "k"]
    first = shared_key_args(tmp_path, [])
    assert first == shared_key_args(tmp_path, ["--tps", "0"])  # the same file, kept
    key = Path(first[1])
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and KeyRing.from_file(key)
    assert shared_key_args(tmp_path, ["--reasoning-key-file=mine"]) == []
