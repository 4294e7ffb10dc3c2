"""Layering: the clients are built on ``protocol`` only and never import the server (ARCH)."""

from __future__ import annotations

import subprocess
import sys

PROBE = (
    "import sys, clients, clients.demo, clients.coding; "
    "print(sorted(m for m in sys.modules if m == 'engine' or m.startswith('engine.')))"
)


def test_clients_do_not_import_engine() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=30
    )
    assert done.stdout.strip() == "[]"
