"""ARCH-1: ``protocol`` is pure; ``clients`` never import ``engine``."""

from __future__ import annotations

import subprocess
import sys

FORBIDDEN_FOR_PROTOCOL = ("asyncio", "aiohttp", "engine", "clients", "uvloop", "numpy")


def _modules_after_import(package: str) -> set[str]:
    code = f"import sys, {package}, importlib, pkgutil\n" + (
        f"for m in pkgutil.walk_packages({package}.__path__, '{package}.'):\n"
        "    importlib.import_module(m.name)\n"
        "print('\\n'.join(sorted(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    return set(out.split())


def test_protocol_imports_no_io_or_engine() -> None:
    loaded = _modules_after_import("protocol")
    for name in FORBIDDEN_FOR_PROTOCOL:
        assert not any(m == name or m.startswith(name + ".") for m in loaded), name


def test_clients_do_not_import_engine() -> None:
    loaded = _modules_after_import("clients")
    assert not any(m == "engine" or m.startswith("engine.") for m in loaded)


def test_engine_core_does_not_import_aiohttp() -> None:
    """engine/ (outside engine/server) knows nothing of aiohttp."""
    code = (
        "import sys, importlib, pkgutil, engine\n"
        "for m in pkgutil.walk_packages(engine.__path__, 'engine.'):\n"
        "    if not m.name.startswith('engine.server'):\n"
        "        importlib.import_module(m.name)\n"
        "print('aiohttp.web' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
