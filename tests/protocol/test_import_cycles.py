"""ARCH-1: no import circle among our own modules, type-only imports included.

The graph is read from the source (``ast``), not from ``sys.modules``: an import under
``if TYPE_CHECKING:`` or inside a function is still a dependency a reader has to follow, so it
counts as an edge. Importing a package's ``__init__`` implicitly is not an edge.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("protocol", "engine", "clients")


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imported(tree: ast.AST, module: str, is_package: bool, known: set[str]) -> set[str]:
    """Every module of ours that ``module`` names in an ``import`` or ``from`` statement."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against the importing module's package
                anchor = module.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from pkg import mod`` names the submodule; ``from mod import name`` the module.
            submodules = {f"{base}.{alias.name}" for alias in node.names} & known
            out.update(submodules or ({base} & known))
    return out


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        graph[name] = _imported(tree, name, path.name == "__init__.py", known) - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles() -> None:
    assert cycles(import_graph()) == []


def test_the_cycle_check_sees_type_only_imports() -> None:
    """The checker itself: a circle closed only under ``TYPE_CHECKING`` is still found."""
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from engine.a import X\n"
    tree = ast.parse(source)
    known = {"engine.a", "engine.b"}
    graph = {"engine.a": {"engine.b"}, "engine.b": _imported(tree, "engine.b", False, known)}
    assert cycles(graph) == [["engine.a", "engine.b"]]
    assert cycles({"engine.a": {"engine.b"}, "engine.b": set()}) == []
