"""Every file path and rule ID that SPEC.md, README.md, docs/ and the code's docstrings and
comments cite exists (ARCHITECTURE habit 12), so drift fails CI instead of misleading a reader.

A path is cited in backticks in the documents (`engine/store/memory.py`, `coroutine.py`,
`tests/test_floors.py::test_x`, `engine/connection/loader.py:load_conversation`), or bare in a
docstring or comment (engine/store/memory.py). One that starts with a folder of this repository must
name a tracked file or folder; a shorter one (`parsers/hermes.py`, `coroutine.py`) must be the
end of one. Paths of other projects and of files the engine writes or reads at run time are
listed below, each with whose it is; nothing else is exempt. The documents state no machine
paths (``/work/...``, ``/tmp/...``): a reader's checkout is elsewhere.
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import tokenize
from functools import cache
from pathlib import Path

from tests.support.rules import ID, NOT_RULES
from tests.support.rules import definitions as _definitions

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = ("SPEC.md", "README.md", "docs")
CODE = ("protocol", "engine", "clients", "cli", "tools", "bench", "tests")
TOP = ("engine/", "protocol/", "clients/", "tests/", "cli/", "tools/", "deploy/", "docs/",
       "bench/", ".ci/")  # fmt: skip
TICKED = re.compile(r"`([^`\s]+)`")
FILE_LIKE = re.compile(r"\.(py|md|toml|cfg|in|ya?ml|json|sh|txt|html|j2|jinja|rs|cpp|ts|js)$")
BARE = re.compile(
    r"(?<![\w./-])((?:engine|protocol|clients|cli|deploy|docs|bench|\.ci)/[\w./-]*\w)"
)
# This machine's checkout and home (a recipe's scratch folder under /tmp is fine).
MACHINE = re.compile(r"(?<![\w.])/(?:work|root)/[\w.-]")
# Another project's files, cited where the engine follows or mirrors them: prefix -> whose.
EXTERNAL = {
    "codex-api/": "openai/codex",
    "codex-client/": "openai/codex",
    "codex-rs/": "openai/codex",
    "core/src/": "openai/codex",
    "endpoint/": "openai/codex (codex-api/src/endpoint)",
    "sse/": "openai/codex (codex-api/src/sse)",
    "openai/": "openai-python",
    "vllm/": "vllm",
    "serve/disagg/": "vllm (vllm/entrypoints/serve/disagg)",
    "python/sglang/": "sglang",
    "tokenizer_manager_components/": "sglang",
    "protocol/src/": "smg / agentic-api (Rust)",
    "tools/server": "llama.cpp",
    "tools/src/": "openai/codex (codex-rs/tools/src)",
    "vendor/llama.cpp": "llama-cpp-python's sdist",
    "tools/list": "MCP (a method name, not a file)",
    "tools/call": "MCP (a method name, not a file)",
    "_base_client.py": "openai-python",
    "_state.py": "h11",
    "tool_parsers/": "vllm (vllm/entrypoints/openai/tool_parsers)",
    "nemo_gym/": "NeMo Gym (NVIDIA-NeMo/Gym)",
    "responses_api_models/": "NeMo Gym (NVIDIA-NeMo/Gym)",
    "responses_api_agents/": "NeMo Gym (NVIDIA-NeMo/Gym)",
    "src/calc/": "the coding scenario's generated workspace (clients/coding_files.py)",
}
# Files the engine, its benchmark or its users write or read at run time (not in the repo).
RUN_TIME = {
    "bench-codex.json", "bench-extras.json", "bench-peers.json", "bench100.json", "bench.json",
    "config.toml",  # Codex's own configuration
    "notes.txt",  # a file the coding scenario's agent writes
    "tokenizer.json", "tokenizer_config.json",  # a model's tokenizer folder (TOK-1)
    "sitecustomize.py",  # written by the profiling recipe of docs/benchmark.md
}  # fmt: skip


@cache
def _tree() -> tuple[frozenset[str], frozenset[str]]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    files = frozenset(f for f in out if (ROOT / f).exists())
    folders = {"/".join(f.split("/")[:i]) for f in files for i in range(1, f.count("/") + 1)}
    return files, frozenset(folders)


def exists(cited: str) -> bool:
    path = re.sub(r"(::.*|:[A-Za-z_]\w*|:\d+)$", "", cited).rstrip("/")
    if path in RUN_TIME or any((path + "/").startswith(p) for p in EXTERNAL):
        return True
    files, folders = _tree()
    if path in files or path in folders:
        return True
    if path.startswith(TOP):
        return False
    tail = "/" + path
    return any(f.endswith(tail) for f in files) or any(d.endswith(tail) for d in folders)


# SPEC.md states rules, not how they were measured or found (TEST-3): no measured figures, no
# commit hashes, no issue numbers. Those live in docs/rationale.md and docs/benchmark.md.
MEASURED = re.compile(r"\b(?:measured|median|load average|p(?:50|90|95|99))\b|\bissue \d+", re.I)
COMMIT = re.compile(r"(?<![\w/.-])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w-])")


def measurements_in(text: str) -> list[str]:
    """The lines of a text that state a measurement, a commit hash or an issue number."""
    return [
        f"{n}: {line.strip()[:80]}"
        for n, line in enumerate(text.splitlines(), 1)
        if MEASURED.search(line) or COMMIT.search(line)
    ]


# The Responses API digest SPEC cites as PROTOCOL: a copy of the team's reference, whose paths
# are the SDKs' own (openai-python, openai-agents), not this repository's.
DIGEST = "docs/responses-protocol.md"


def _documents() -> list[Path]:
    found: list[Path] = []
    for name in DOCUMENTS:
        path = ROOT / name
        found.extend(sorted(path.rglob("*.md")) if path.is_dir() else [path])
    return [doc for doc in found if doc != ROOT / DIGEST]


def cited_in_document(text: str) -> set[str]:
    out = set()
    for cited in TICKED.findall(text):
        if cited.startswith(("/", "http", "~", "$", ".venv")) or any(c in cited for c in "*{<…"):
            continue
        bare = re.sub(r"(::.*|:[A-Za-z_]\w*|:\d+)$", "", cited)
        if FILE_LIKE.search(bare) or (cited.startswith(TOP) and "/" in cited.rstrip("/")):
            out.add(cited)
    return out


def prose_of(source: str) -> str:
    """A module's docstrings and comments, the parts of it written for a reader."""
    parts = [
        tok.string
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                parts.append(doc)
    return "\n".join(parts)


def test_every_path_a_document_cites_exists() -> None:
    missing = {
        f"{doc.relative_to(ROOT)}: {cited}"
        for doc in _documents()
        for cited in cited_in_document(doc.read_text(encoding="utf-8"))
        if not exists(cited)
    }
    assert not missing, sorted(missing)


def test_every_path_a_docstring_or_comment_cites_exists() -> None:
    files, _ = _tree()
    missing = set()
    for name in sorted(files):
        if name.endswith(".py") and name.startswith(tuple(f"{c}/" for c in CODE)):
            prose = prose_of((ROOT / name).read_text(encoding="utf-8"))
            cited = set(BARE.findall(prose)) | cited_in_document(prose)
            missing |= {f"{name}: {c}" for c in cited if not exists(c)}
    assert not missing, sorted(missing)


def test_every_rule_a_document_cites_is_defined() -> None:
    """The code's citations are checked by tests/test_spec_ids.py; these are the documents'."""
    defined = _definitions()
    dangling = {
        f"{doc.relative_to(ROOT)}: {rule}"
        for doc in _documents()
        for rule in ID.findall(doc.read_text(encoding="utf-8"))
        if rule not in defined and not NOT_RULES.match(rule)
    }
    assert not dangling, sorted(dangling)


def test_no_document_names_a_machine_path() -> None:
    named = {
        f"{doc.relative_to(ROOT)}:{n}: {line.strip()[:80]}"
        for doc in _documents()
        for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1)
        if MACHINE.search(line)
    }
    assert not named, sorted(named)


def test_spec_states_no_measurements() -> None:
    """TEST-3: SPEC.md holds the rules; measurements, commit hashes and issue history are in
    docs/rationale.md and docs/benchmark.md."""
    found = measurements_in((ROOT / "SPEC.md").read_text(encoding="utf-8"))
    assert not found, found


def test_the_measurement_check_sees_figures_and_hashes() -> None:
    """TEST-3 can fail: a measured figure, a median, a commit and an issue are seen; rule text
    with units, bounds, ids and hex bytes is not."""
    assert measurements_in("Measured: 4.19 ms plain\nmedian 50 µs\nsince commit 59cd6b8")
    assert measurements_in("as issue 24's soak showed") and measurements_in("p99 311 ms")
    rules = "every 500 ms, at most 2 s\n`resp_979e9fecb81ea9f825cfaf83cc6ec29e`\n`00 00 ff ff`"
    assert not measurements_in(rules + "\n`sha256` of 16 MiB; deadbeef is a word")


def test_the_checks_see_a_dangling_path_and_rule() -> None:
    """The rules above can fail: a renamed module, a bare path and an unknown rule are seen."""
    assert not exists("engine/tokens.py") and exists("engine/store/memory.py")
    assert not exists("no_such_module.py") and exists("coroutine.py")
    assert exists("engine/connection/loader.py:load_conversation")
    assert cited_in_document("see `engine/tokens.py` and `x`") == {"engine/tokens.py"}
    assert BARE.findall(prose_of('"""Lives in engine/gone.py."""\n')) == ["engine/gone.py"]
    assert "NOPE" + "-1" not in _definitions()
