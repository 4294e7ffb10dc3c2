"""A private PostgreSQL cluster, for ``rollout bench --store postgres`` (BENCH-6) and the tests
(STORE-TEST-2): Debian's ``postgresql`` server binaries (installed by ``.ci/sysdeps``),
``initdb`` into a temp dir, ``pg_ctl`` on a free loopback port with its unix socket in that dir,
fsync on (Postgres's default durability). initdb refuses to run as root, so as root every
command runs as the ``postgres`` user (``runuser``). Its commands block: call them from a
thread on an event loop."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import psycopg

DAEMON_USER = "postgres"  # Debian's package creates it
USER = "rollout"  # the cluster's superuser, trusted on loopback only


def bindir() -> Path:
    """The newest installed server's binaries, or a clear failure (never a skip)."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3])
    )
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    if initdb is None:
        raise AssertionError(
            "PostgreSQL server binaries missing (initdb): `make sysdeps` installs Debian's"
            " postgresql package (apt-get install postgresql)"
        )
    return Path(initdb).parent


class PostgresCluster:
    """One cluster in its own temp dir; ``start``/``stop``/``crash`` keep its port and data."""

    def __init__(self) -> None:
        self.bin = bindir()
        self.root = Path(tempfile.mkdtemp(prefix="rollout-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self._as_root = os.geteuid() == 0
        self._databases = 0
        if self._as_root:
            shutil.chown(self.root, DAEMON_USER)
        self._pg("initdb", "-D", str(self.data), "-U", USER, "--auth=trust", "-E", "UTF8",
                 "--no-sync", "--no-instructions")  # fmt: skip

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        # syncfs: after a crash the recovery syncs the file system once, not every file
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=on"
            " -c recovery_init_sync_method=syncfs"
        )
        self._pg("pg_ctl", "start", "-w", "-t", "60", "-D", str(self.data),
                 "-l", str(self.root / "server.log"), "-o", options)  # fmt: skip

    def stop(self) -> None:
        """A fast shutdown: sessions are closed, everything committed is kept."""
        self._pg("pg_ctl", "stop", "-w", "-m", "fast", "-D", str(self.data))

    def crash(self) -> None:
        """``immediate``: the server processes quit without a checkpoint (crash recovery on the
        next start replays the WAL: what was committed survives)."""
        self._pg("pg_ctl", "stop", "-w", "-m", "immediate", "-D", str(self.data))

    def create_database(self) -> str:
        """A fresh, empty database; its URL."""
        self._databases += 1
        name = f"rollout_test_{self._databases}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def running(self) -> bool:
        return self._pg("pg_ctl", "status", "-D", str(self.data), check=False) == 0

    def ensure_running(self) -> None:
        """After a test that stopped it, whatever happened there."""
        if not self.running():
            self.start()

    def destroy(self) -> None:
        if self.running():
            self.crash()
        shutil.rmtree(self.root, ignore_errors=True)

    def _pg(self, tool: str, *args: str, check: bool = True) -> int:
        command = [str(self.bin / tool), *args]
        if self._as_root:
            command = ["runuser", "-u", DAEMON_USER, "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0 and check:
            log = self.root / "server.log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise AssertionError(f"{tool} failed: {done.stderr or done.stdout}\n{tail}")
        return done.returncode


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port
