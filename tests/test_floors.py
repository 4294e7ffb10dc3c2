"""The floors of the house and no circles (SPEC: ARCH-1), read from every module's own imports.

    protocol  <-  engine  <-  engine/server        clients  ->  protocol
                         \\___________ cli/main.py ___________/

* ``protocol`` imports only the standard library and msgspec;
* ``engine`` outside ``engine/server`` imports neither ``engine.server``, nor ``clients``, nor
  ``cli``, nor the aiohttp server framework; only the upstream backends in ``engine/models`` use
  aiohttp at all (its HTTP client);
* ``engine/server`` imports no ``clients`` and no ``cli``;
* ``clients`` import no ``engine`` and no ``cli`` (the benchmark starts its server as a
  subprocess, through the ``rollout serve`` command line);
* ``cli/main.py``, the ``rollout`` dispatcher, is the one module that imports both sides;
* ``bench`` (in-process micro benchmarks) imports ``engine`` and ``protocol`` but no transport,
  no ``clients`` and no ``cli``, and nothing imports ``bench``: benchmark scripts stay out of
  the production packages;
* and no module imports another in a circle, even within a floor.

Imports are parsed with ``ast`` from every file, so an import inside a function or under
``if TYPE_CHECKING:`` counts like any other: a type-only edge is still an edge to a reader.
"""

from __future__ import annotations

import abc
import ast
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("protocol", "engine", "clients", "cli", "bench")
AIOHTTP_SERVER = ("aiohttp.web", "aiohttp.web_", "aiohttp.worker")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> Iterator[str]:
    package = _module_name(path)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    return _imports_in(path.read_text(encoding="utf-8"), package)


def _imports_in(source: str, package: str) -> Iterator[str]:
    """Every module name the source imports; ``from a import b`` yields ``a`` and ``a.b`` (``b``
    may be a submodule), relative imports resolved against ``package``."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names if alias.name != "*")


def _files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def _is(name: str, *prefixes: str) -> bool:
    return any(name == p or name.startswith(p if p.endswith("_") else p + ".") for p in prefixes)


def _violations(package: str, forbidden: Callable[[str, str], str | None]) -> list[str]:
    """``forbidden(importing module, imported name)`` gives the broken rule, or None."""
    found = []
    for path in _files(package):
        for name in _imports(path):
            reason = forbidden(_module_name(path), name)
            if reason:
                found.append(f"{path.relative_to(ROOT)} imports {name}: {reason}")
    return sorted(set(found))


def _root(name: str) -> str:
    return name.partition(".")[0]


def test_protocol_imports_only_stdlib_and_msgspec() -> None:
    def forbidden(module: str, name: str) -> str | None:
        top = _root(name)
        if top in sys.stdlib_module_names or top in ("msgspec", "protocol"):
            return None
        return "protocol is pure (standard library and msgspec only)"

    assert _violations("protocol", forbidden) == []


def test_engine_knows_no_transport_and_no_clients() -> None:
    def forbidden(module: str, name: str) -> str | None:
        if _is(name, "clients", "cli"):
            return "the engine never imports the clients' side"
        if module.startswith("engine.server"):
            return None
        if _is(name, "engine.server"):
            return "only engine/server knows the transports"
        if _is(name, *AIOHTTP_SERVER):
            return "the aiohttp server framework belongs to engine/server"
        if _is(name, "aiohttp") and not module.startswith("engine.models."):
            return "only the upstream backends (engine/models) use aiohttp's client"
        return None

    assert _violations("engine", forbidden) == []


def test_clients_speak_the_wire_only() -> None:
    def forbidden(module: str, name: str) -> str | None:
        if _is(name, "engine", "cli"):
            return "clients are built on protocol and reach the server over the wire"
        return None

    assert _violations("clients", forbidden) == []


def test_bench_sits_beside_the_engine() -> None:
    def forbidden(module: str, name: str) -> str | None:
        if _is(name, "clients", "cli", "engine.server"):
            return "an in-process benchmark drives engine parts, not transports or clients"
        return None

    assert _violations("bench", forbidden) == []
    imported = []
    for package in PACKAGES:
        if package != "bench":
            imported += _violations(package, lambda m, n: "bench" if _is(n, "bench") else None)
    assert imported == [], "nothing imports the benchmarks"


def test_only_the_dispatcher_imports_both_sides() -> None:
    both = []
    for package in PACKAGES:
        for path in _files(package):
            roots = {_root(name) for name in _imports(path)}
            if {"engine", "clients"} <= roots:
                both.append(str(path.relative_to(ROOT)))
    assert both == ["cli/main.py"]


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports. ``from pkg import mod`` is an edge to ``mod``,
    not to ``pkg``; importing a package's ``__init__`` implicitly is not an edge."""
    paths = {_module_name(path): path for package in PACKAGES for path in _files(package)}
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        named = {name for name in _imports(path) if name in paths}
        graph[module] = named - {name.rpartition(".")[0] for name in named} - {module}
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


# engine's parts, lowest first (ARCH-1): a part imports only the parts below it, so the folders
# read bottom-up as the data flows: what a conversation is, who samples it, what is observed and
# shared, the engine that holds them, the coroutine, the connection, the inspector, the transports.
ENGINE_PARTS = (
    "engine.settings",
    "engine.fifo",
    "engine.store",
    "engine.conversation",
    "engine.models",
    "engine.observe",
    "engine.retained",
    "engine.hosted",
    "engine.core",
    "engine.rollout",
    "engine.connection",
    "engine.inspector",
    "engine.server",
)
MAX_ENGINE_TOP_MODULES = 8


def engine_part(module: str) -> str | None:
    """The part a module of ``engine`` belongs to: its subpackage, or itself at the top."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "engine" and len(parts) > 1 else None


def floor_violations(
    graph: dict[str, set[str]],
    floors: tuple[str, ...],
    floor_of: Callable[[str], str | None],
    undeclared: str,
) -> list[str]:
    """Each import of a module on a higher floor than its importer's (``floors`` lowest
    first; ``floor_of`` None: not on this house's floors), and each module on no floor."""
    rank = {floor: i for i, floor in enumerate(floors)}
    found = []
    for module, imported in graph.items():
        own = floor_of(module)
        if own is None:
            continue
        if own not in rank:
            found.append(f"{module} {undeclared}")
            continue
        for name in imported:
            other = floor_of(name)
            if other is not None and rank.get(other, -1) > rank[own]:
                found.append(f"{module} imports {name}: {own} sits below {other}")
    return sorted(found)


def part_violations(graph: dict[str, set[str]]) -> list[str]:
    return floor_violations(
        graph, ENGINE_PARTS, engine_part, "is in no declared part of engine (ENGINE_PARTS)"
    )


def test_engine_parts_import_only_downwards() -> None:
    """ARCH-1: no cycle between engine's parts, and one declared order of them."""
    assert part_violations(import_graph()) == []


def test_the_part_check_finds_an_upward_import() -> None:
    graph = {"engine.conversation.render": {"engine.rollout.coroutine"}, "engine.x.y": set()}
    assert part_violations(graph) == [
        "engine.conversation.render imports engine.rollout.coroutine: engine.conversation "
        "sits below engine.rollout",
        "engine.x.y is in no declared part of engine (ENGINE_PARTS)",
    ]


# engine/server's floors, lowest first (ARCH-1): the transport (the WebSocket driver, the SSE
# sink, identity, limits, idempotency, the node-to-node client and verifier) imports no route;
# routes (one module per resource) use the transport; the app assembles routes and middlewares;
# the process (flags, workers, serve) starts the app.
SERVER_FLOORS = (
    "engine.server.transport",
    "engine.server.routes",
    "engine.server.app",
    "engine.server.process",
)


def server_floor(module: str) -> str | None:
    """The floor of a module of ``engine.server``: its subpackage, or itself at the top."""
    parts = module.split(".")
    if parts[:2] != ["engine", "server"] or len(parts) < 3:
        return None
    return ".".join(parts[:3])


def server_violations(graph: dict[str, set[str]]) -> list[str]:
    return floor_violations(
        graph,
        SERVER_FLOORS,
        server_floor,
        "is on no declared floor of engine/server (SERVER_FLOORS)",
    )


def test_the_server_is_layered_by_role() -> None:
    """ARCH-1 inside engine/server: process -> app -> routes -> transport, never back up."""
    assert server_violations(import_graph()) == []


def test_the_server_floor_check_finds_a_transport_importing_a_route() -> None:
    graph = {
        "engine.server.transport.http": {"engine.server.routes.v1_responses"},
        "engine.server.routes.v1_responses": {"engine.server.transport.http"},
        "engine.server.oddity": set(),
    }
    assert server_violations(graph) == [
        "engine.server.oddity is on no declared floor of engine/server (SERVER_FLOORS)",
        "engine.server.transport.http imports engine.server.routes.v1_responses: "
        "engine.server.transport sits below engine.server.routes",
    ]


def hydrate_callers(root: Path) -> list[str]:
    """Modules of engine outside the store that call a ``.hydrate(...)``: the loader only."""
    found = []
    for path in sorted((root / "engine").rglob("*.py")):
        if "store" in path.relative_to(root / "engine").parts[:1]:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            is_call = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            if is_call and node.func.attr == "hydrate":
                found.append(str(path.relative_to(root)))
                break
    return found


def test_only_the_loader_hydrates_from_the_store() -> None:
    """OWN-4: every stored conversation is read through ``engine/connection/loader.py``, the one
    loader whose owner argument has no default; no other module calls ``store.hydrate``."""
    assert hydrate_callers(ROOT) == ["engine/connection/loader.py"]


def test_the_hydrate_check_finds_a_second_caller(tmp_path: Path) -> None:
    for name, body in (("connection/loader.py", "s.hydrate(1)"), ("server/x.py", "s.hydrate(2)")):
        (tmp_path / "engine" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "engine" / name).write_text(body)
    assert hydrate_callers(tmp_path) == ["engine/connection/loader.py", "engine/server/x.py"]


def test_engine_top_level_stays_small() -> None:
    top = [p for p in (ROOT / "engine").glob("*.py") if p.name != "__init__.py"]
    assert len(top) <= MAX_ENGINE_TOP_MODULES, sorted(p.name for p in top)


def test_the_cycle_check_finds_a_circle() -> None:
    assert cycles({"engine.a": {"engine.b"}, "engine.b": {"engine.a"}}) == [
        ["engine.a", "engine.b"]
    ]
    assert cycles({"engine.a": {"engine.b"}, "engine.b": set()}) == []


def test_the_checker_sees_every_kind_of_import() -> None:
    """Lazy, TYPE_CHECKING, ``from`` and relative imports are all found."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from clients.loop import Hooks\n"
        "def f():\n    from aiohttp import web\n"
        "from .server import app\n"
        "from ..protocol import items\n"
    )
    names = set(_imports_in(source, "engine.models"))
    expected = {"clients.loop", "aiohttp.web", "engine.models.server.app", "engine.protocol.items"}
    assert expected <= names


def test_importing_protocol_loads_no_io() -> None:
    """At run time too: importing every protocol module pulls in no asyncio or aiohttp."""
    code = (
        "import sys, importlib, pkgutil, protocol\n"
        "for m in pkgutil.walk_packages(protocol.__path__, 'protocol.'):\n"
        "    importlib.import_module(m.name)\n"
        "print('\\n'.join(sorted(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(done.stdout.split())
    for name in ("asyncio", "aiohttp", "engine", "clients", "cli", "uvloop", "numpy"):
        assert not any(_is(m, name) for m in loaded), name


def imports_of_test_modules(test_root: Path) -> list[str]:
    """Every import of a ``test_*.py`` module by another module under ``tests/``: shared helpers
    live in ``tests/support`` (or a non-test module beside their tests), so a test module can
    be read, run and changed alone (issue 18 §5)."""
    found = []
    for path in sorted(test_root.rglob("*.py")):
        package = ".".join(path.relative_to(test_root.parent).with_suffix("").parts[:-1])
        for name in _imports_in(path.read_text(encoding="utf-8"), package):
            names = name.split(".")
            # the root conftest too: it holds the suite's hooks; its helpers live in tests/support
            tests = [
                i
                for i, part in enumerate(names)
                if i and (part.startswith("test_") or names[: i + 1] == ["tests", "conftest"])
            ]
            if tests:  # ``from tests.a.test_y import h`` names ``tests.a.test_y.h`` too
                module = ".".join(names[: tests[0] + 1])
                found.append(f"{path.relative_to(test_root.parent)} imports {module}")
    return sorted(set(found))


def test_no_test_module_imports_another() -> None:
    """TEST-1."""
    assert imports_of_test_modules(ROOT / "tests") == []


def test_the_test_import_check_finds_one(tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    (tests / "a").mkdir(parents=True)
    (tests / "a" / "test_x.py").write_text("from tests.a.test_y import helper\n")
    (tests / "a" / "test_z.py").write_text("from tests.support.ws import read_until\n")
    (tests / "a" / "test_w.py").write_text("from tests.conftest import LiveServer\n")
    assert imports_of_test_modules(tests) == [
        "tests/a/test_w.py imports tests.conftest",
        "tests/a/test_x.py imports tests.a.test_y",
    ]


# Small rooms (ARCH-1): no class over 300 lines, no function over 50 statements. The few rooms
# still over are listed with their size today: the check fails if one grows or a new one
# appears, and an entry is deleted when its room is split.
MAX_CLASS_LINES, MAX_FUNCTION_STATEMENTS = 300, 50
STILL_LARGE = {
    "tests/fuzz/test_live_http.py:HttpProtocolMachine": 479,
    "tests/fuzz/ws_machine/bad_frames.py:malformed_frame": 66,
    "tests/fuzz/ws_machine/appends.py:_append": 58,
    "tests/fuzz/ws_machine/steering.py:_steer_waiting": 55,
}


def oversized(root: Path) -> dict[str, int]:
    """Every class over ``MAX_CLASS_LINES`` lines and every function over
    ``MAX_FUNCTION_STATEMENTS`` statements (its own def not counted), by ``path:name``."""
    found: dict[str, int] = {}
    for package in (*PACKAGES, "tests", "tools"):  # tools/ is code too
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                where = f"{path.relative_to(root)}:{getattr(node, 'name', '')}"
                if isinstance(node, ast.ClassDef):
                    lines = (node.end_lineno or node.lineno) - node.lineno + 1
                    if lines > MAX_CLASS_LINES:
                        found[where] = lines
                elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    statements = sum(isinstance(n, ast.stmt) for n in ast.walk(node)) - 1
                    if statements > MAX_FUNCTION_STATEMENTS:
                        found[where] = statements
    return found


def test_rooms_stay_small() -> None:
    found = oversized(ROOT)  # one walk of the tree (it parses every module)
    grown = {k: v for k, v in found.items() if v > STILL_LARGE.get(k, 0)}
    assert grown == {}, "split it, or keep it within the limits (ARCH-1)"
    gone = set(STILL_LARGE) - set(found)
    assert not gone, f"{gone} is small now: delete it from STILL_LARGE"


def test_the_room_check_finds_a_big_one(tmp_path: Path) -> None:
    (tmp_path / "engine").mkdir()
    for package in (*PACKAGES, "tests"):
        (tmp_path / package).mkdir(exist_ok=True)
    body = "\n".join(f"    x{n} = {n}" for n in range(MAX_FUNCTION_STATEMENTS + 1))
    (tmp_path / "engine" / "big.py").write_text(f"def f():\n{body}\n")
    assert oversized(tmp_path) == {"engine/big.py:f": MAX_FUNCTION_STATEMENTS + 1}


# engine/models' rooms (ARCH-1): the simulator, the HTTP upstreams and the token-in path are
# separate rooms over base.py; only the token path may lean on the upstreams (their endpoint,
# pool and chat message mapping), never the reverse, and the simulator leans on neither.
MODEL_ROOMS_MAY_NOT_IMPORT = {
    "engine.models.sim": ("engine.models.upstreams", "engine.models.tokens"),
    "engine.models.upstreams": ("engine.models.sim", "engine.models.tokens"),
    "engine.models.tokens": ("engine.models.sim",),
}


def test_model_rooms_stay_apart() -> None:
    found = []
    for module, imported in import_graph().items():
        for room, forbidden in MODEL_ROOMS_MAY_NOT_IMPORT.items():
            if _is(module, room):
                found += [f"{module} imports {name}" for name in imported if _is(name, *forbidden)]
    assert sorted(found) == []


# Capabilities are declared, not probed (ARCH-1): ``engine.models.base.Backend`` declares each
# optional capability with its default, so no caller asks ``getattr(backend, ...)`` or
# ``hasattr(backend, ...)``.
def backend_probes(root: Path) -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr")
                    and node.args
                ):
                    continue
                probed = ast.unparse(node.args[0])
                if "backend" in probed.rsplit(".", 1)[-1].lower():
                    found.append(f"{path.relative_to(root)}:{node.lineno} {ast.unparse(node)}")
    return found


def test_no_caller_probes_a_backend() -> None:
    assert backend_probes(ROOT) == [], "declare the capability on Backend (engine/models/base.py)"


# One registry per extension point (ARCH-1): a tokens route's formats (``api``, ``template``,
# ``tool_parser``, ``reasoning_parser``) are looked up in their registries, never told apart by
# comparing a name in engine/models/tokens (no ``if api == "vllm"``, no ``== "think"``), and no
# format is implied by another field (``tokenizer is None`` meant harmony).
FORMAT_FIELDS = frozenset({"api", "template", "tool_parser", "reasoning_parser", "tokenizer"})
FORMAT_NAMES = frozenset(
    {"vllm", "sglang", "llamacpp", "jinja", "harmony", "think", "hermes", "qwen3_coder"}
    | {"llama3_json", "mistral"}
)


def format_dispatch(folder: Path) -> list[str]:
    def named(node: ast.expr) -> str | None:
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.Attribute):
            return node.attr
        return None

    found = []
    for path in sorted(folder.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        # an assert states what the config already checked; it dispatches nothing
        asserted = {id(n) for a in ast.walk(tree) if isinstance(a, ast.Assert) for n in ast.walk(a)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Compare) or id(node) in asserted:
                continue
            sides = [node.left, *node.comparators]
            fields = {named(side) for side in sides} & FORMAT_FIELDS
            names = {
                c.value
                for side in sides
                for c in ast.walk(side)
                if isinstance(c, ast.Constant) and isinstance(c.value, str)
            } & FORMAT_NAMES
            if fields or names:
                found.append(f"{path.relative_to(folder.parent)}:{node.lineno} {ast.unparse(node)}")
    return found


def test_token_formats_are_dispatched_by_their_registries() -> None:
    assert format_dispatch(ROOT / "engine" / "models" / "tokens") == []


def test_the_dispatch_checks_find_a_comparison_and_a_probe(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    (tokens / "a.py").write_text(
        'if options.api == "llamacpp":\n    pass\nif tokenizer is None:\n    pass\n'
        'ok = channel == "analysis"\nassert tokenizer is not None\n'
    )
    assert format_dispatch(tokens) == [
        "tokens/a.py:1 options.api == 'llamacpp'",
        "tokens/a.py:3 tokenizer is None",
    ]
    for package in PACKAGES:
        (tmp_path / package).mkdir(exist_ok=True)
    (tmp_path / "engine" / "b.py").write_text('w = getattr(self._rollout.backend, "weights", "")\n')
    assert backend_probes(tmp_path) == [
        "engine/b.py:1 getattr(self._rollout.backend, 'weights', '')"
    ]


# Benchmark scripts live in ``bench/``, not in the production packages: no module of engine,
# protocol or cli parses its own command line as a script (``if __name__ == "__main__"``).
def scripts_in(root: Path, packages: tuple[str, ...]) -> list[str]:
    found = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            if path.name != "__main__.py" and '__name__ == "__main__"' in path.read_text(
                encoding="utf-8"
            ):
                found.append(str(path.relative_to(root)))
    return found


def test_no_script_in_the_production_packages() -> None:
    assert scripts_in(ROOT, ("protocol", "engine")) == []


# Rooms by concept (issue 30): a folder a reader can take in at once, and one name per concept.
MAX_MODULES_PER_FOLDER = 15
# A module name may appear in more than one folder only where it names the same concept on
# different floors or sides (the rate limits of the wire, the store, the process and the
# transport); every other repeat is two concepts under one name.
SAME_CONCEPT = {
    "__init__": "every package",
    "__main__": "a package's entry point",
    "ratelimits": "per-key rate limits: wire headers, store counters, quotas, transport",
    "background": "background runs: the runs (connection/) and their HTTP routes (server/)",
    "export": "trajectory export: the route (server/) and its client (clients/)",
    "accounting": "usage accounting: the process ledger (observe/) and a rollout's books",
    "compaction": "compaction: the window (conversation/) and running it on a model (models/)",
    "render": "rendering to tokens: cl100k (conversation/) and the model's template (tokens/)",
    "trajectory": "the model-token trajectory: in the context and in the store",
    "carried": "token ids carried back on items: taken off (conversation/), continued (tokens/)",
    "http": "HTTP: the server transport and the client",
    "base": "an extension point's base class: Backend (models/), TokenServer (tokens/servers/)",
    "conversations": "the Conversations API: its wire shapes, its store records, its routes",
    "sealed": "sealed reasoning: sealing and opening (conversation/), replaying its ids (tokens/)",
    "footprint": "memory charged: the walk and a toolset (protocol/), a context (conversation/)",
}


def _source_modules() -> list[Path]:
    return [p for package in PACKAGES for p in _files(package)]


def test_no_folder_is_a_crowd() -> None:
    """ROOMS-1: no folder, source or tests, holds more than 15 modules; a bigger one is split
    by concept (a test subfolder keeps its parent's conftest fixtures)."""
    counts: dict[Path, int] = {}
    for path in [*_source_modules(), *_files("tests")]:
        if path.name != "__init__.py":
            counts[path.parent] = counts.get(path.parent, 0) + 1
    crowded = {
        str(folder.relative_to(ROOT)): n
        for folder, n in counts.items()
        if n > MAX_MODULES_PER_FOLDER
    }
    assert not crowded, f"folders over {MAX_MODULES_PER_FOLDER} modules: {crowded}"


def test_one_name_per_concept() -> None:
    """ROOMS-2: a module name repeats across folders only for one concept (``SAME_CONCEPT``)."""
    seen: dict[str, list[str]] = {}
    for path in _source_modules():
        seen.setdefault(path.stem, []).append(str(path.relative_to(ROOT)))
    reused = {
        name: places
        for name, places in seen.items()
        if len(places) > 1 and name not in SAME_CONCEPT
    }
    assert not reused, f"one name, several concepts: {reused}"


# The cluster-state port's names: none of them may sit on a record store (ARCHITECTURE:
# "Compose, don't stack").
CLUSTER_NAMES = (
    "claim_key",
    "settle_key",
    "release_key",
    "claim",
    "_claim",
    "register_parked",
    "parked_at",
    "unregister_parked",
    "_set_parked",
    "_get_parked",
    "node_token",
    "on_delete",
    "notify_deleted",
    "announce_continued",
    "on_continued",
    "notify_continued",
    "_publish_continued",
    "limits",
    "shares_parking",
)


def _cluster_names_on(store: object) -> list[str]:
    return [name for name in CLUSTER_NAMES if hasattr(store, name)]


def test_the_store_is_composed_not_stacked() -> None:
    """The store is records plus a cluster-state port (``store.cluster``), one port class per
    backend: no backend stacks record classes, and no record store answers a cluster name."""
    from engine.store import ClusterState, MemoryStore, ResponseStore
    from engine.store.embedded.sqlite import SqliteStore
    from engine.store.postgres import PostgresStore
    from engine.store.redis import RedisStore

    assert ResponseStore.__bases__ == (abc.ABC,), "records stand on no mixins"
    backends = (MemoryStore, SqliteStore, RedisStore, PostgresStore)
    for backend in backends:
        assert backend.__bases__ == (ResponseStore,), backend
        assert not _cluster_names_on(backend), (backend, _cluster_names_on(backend))
        assert issubclass(backend.cluster_state, ClusterState)
    store = MemoryStore()
    assert not _cluster_names_on(store)
    assert isinstance(store.cluster, ClusterState) and store.cluster.store is store
    assert all(hasattr(store.cluster, name) for name in CLUSTER_NAMES)
    ports = {backend.cluster_state for backend in backends if backend is not MemoryStore}
    assert len(ports) == 3 and ClusterState not in ports, "one port per shared backend"
