"""One writer for each piece of shared connection state (issue 18 §2; CACHE-1, OWN-4).

Read from the source with ``ast``: a lane's cache (``Lane.latest``, each entry's ``rollout``)
is written by ``engine/connection/lane.py`` only, and a session's append targets by the
session only; the rest of the engine goes through their methods.
"""

from __future__ import annotations

import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[2] / "engine"


def _writers(attribute: str) -> set[str]:
    """Modules of engine/ that assign to ``<anything>.<attribute>`` or mutate it in place."""
    found: set[str] = set()
    for module in ENGINE.rglob("*.py"):
        for node in ast.walk(ast.parse(module.read_text())):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            for target in targets:
                while isinstance(target, ast.Subscript):  # x.attr[key] = ... mutates x.attr
                    target = target.value
                if isinstance(target, ast.Attribute) and target.attr == attribute:
                    found.add(module.relative_to(ENGINE).as_posix())
    return found


def test_only_the_lane_writes_its_cache() -> None:
    """CACHE-1: the lane's latest entry and the entry's suspended rollout have one writer."""
    assert _writers("_latest") == {"connection/lane.py"}
    assert _writers("latest") <= {"server/routes/inspector.py"}  # the feed's own, unrelated field
    assert _writers("rollout") == {"connection/lane.py"}


def test_only_the_targets_write_the_append_targets() -> None:
    """APPEND-3: append targets are the connection's ``Targets``; compat calls
    ``serving``/``served``."""
    assert _writers("_append_targets") == {"connection/targets.py"}
    assert _writers("append_targets") == set()
