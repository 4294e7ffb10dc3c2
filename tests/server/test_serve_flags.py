"""``rollout serve``'s flags come from the config fields; each default is written once (CFG-6)."""

from __future__ import annotations

import argparse
import ast
import asyncio
import dataclasses
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from engine.core import EngineConfig
from engine.server.process import flags
from engine.server.transport.server_config import ServerConfig
from engine.settings import duration, flags_of

ROOT = Path(__file__).resolve().parents[2]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    flags.add_serve_parser(parser.add_subparsers(dest="command"))
    return parser


def _serve_parser() -> argparse.ArgumentParser:
    parser = _parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["serve"]


def test_every_flagged_field_has_its_flag_with_its_default() -> None:
    args = _parser().parse_args(["serve"])
    options = {o for a in _serve_parser()._actions for o in a.option_strings} - {"-h", "--help"}
    declared = set()
    for cls in flags.FLAGGED:
        for field, flag in flags_of(cls):
            declared.add(flag.name)
            assert getattr(args, field.name) == field.default, (cls.__name__, field.name)
    assert options == declared  # no flag without a field, no flagged field without its flag
    assert len(declared) == 61  # the hand-written parser's 38, then --max-queued-bytes,
    # --node-id, --admin-keys-file, --admin-keys-env, --drain-delay, --rate-requests,
    # --rate-tokens, --rate-concurrent, --rate-window, --otel-endpoint, --no-ws-deflate,
    # --idempotency-ttl, --advertise-url, --memory-budget, --max-connections-per-key,
    # --allow-anonymous, --reasoning-key-file (SEAL-5), --inspector-session-ttl (AUTH-14),
    # --mcp-call-timeout, --mcp-max-output, --mcp-max-calls, --mcp-allow-hosts (MCP-*),
    # --full-echo (RESP-5)


def test_a_flag_lands_in_its_field_and_the_configs_are_frozen() -> None:
    argv = ["serve", "--max-queued", "3", "--no-websocket", "--store-ttl", "12h", "--tps", "0"]
    args = _parser().parse_args([*argv, "--port", "0", "--upstream", "http://h/v1"])
    engine = flags.engine_config(args, "m")
    server = flags.server_config(args)
    options = flags.serve_options(args)
    assert (engine.max_queued_creates, engine.store_ttl_s, engine.tokens_per_second) == (
        3,
        43200,
        0,
    )
    assert engine.default_model == "m" and flags.engine_config(args).default_model == "sim"
    assert server.websocket_enabled is False and server.max_connections == 1024
    assert (options.port, options.upstream) == (0, "http://h/v1")
    with pytest.raises(dataclasses.FrozenInstanceError):
        engine.default_model = "other"  # type: ignore[misc]
    with pytest.raises(SystemExit):  # a bad duration is argparse's usage error, exit 2
        _parser().parse_args(["serve", "--store-ttl", "3x"])


def _number(node: ast.expr) -> object:
    """A literal, or a product of literals (``32 * 1024 * 1024``)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        left, right = _number(node.left), _number(node.right)
        if isinstance(left, int | float) and isinstance(right, int | float):
            return left * right
        return None
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None


def literal_defaults(root: Path) -> dict[object, list[tuple[str, str]]]:
    """Every number written as a default in engine/: a dataclass field, a parameter default,
    an argparse ``default=``. Value -> (where, the name it is the default of)."""
    found: dict[object, list[tuple[str, str]]] = defaultdict(list)
    for path in sorted((root / "engine").rglob("*.py")):
        where = str(path.relative_to(root))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            pairs: list[tuple[ast.expr, str]] = []
            if isinstance(node, ast.AnnAssign) and node.value is not None:
                value = node.value
                if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "setting":
                    value = value.args[0]
                pairs.append((value, ast.unparse(node.target)))
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                args = [*node.args.posonlyargs, *node.args.args]
                named = (a.arg for a in reversed(args))
                pairs += zip(reversed(node.args.defaults), named, strict=False)
                pairs += (
                    (d, a.arg)
                    for a, d in zip(node.args.kwonlyargs, node.args.kw_defaults, strict=True)
                    if d
                )
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                flag = ast.unparse(node.args[0]) if node.args else "?"
                pairs += ((k.value, flag) for k in node.keywords if k.arg == "default")
            for expr, name in pairs:
                number = _number(expr)
                if isinstance(number, int | float) and not isinstance(number, bool):
                    found[number].append((f"{where}:{expr.lineno}", name))
    return found


def _words(name: str) -> set[str]:
    return set(re.split(r"[_\-'\"]+", name.lower())) - {"", "max", "s", "size", "per", "bytes"}


def written_more_than_once(root: Path) -> dict[str, list[str]]:
    """Each config field whose default is written again: as a flag's ``default=``, or as the
    default of a parameter named like it (``max_entries`` for ``store_max_entries``)."""
    found = literal_defaults(root)
    fields = [f for cls in flags.FLAGGED for f in dataclasses.fields(cls)]
    names = {f.name for f in fields}
    again = {}
    for field in fields:
        if not isinstance(field.default, int | float) or isinstance(field.default, bool):
            continue
        places = [
            where
            for where, name in found.get(field.default, [])
            if name == field.name
            or (
                name not in names
                and not name.startswith(("'--", '"--'))
                and _words(name) & _words(field.name)
            )
            # a flag repeating a field's value is a copy only when it sets the same thing
            or (name.startswith(("'--", '"--')) and _words(name.strip("'\"-")) & _words(field.name))
        ]
        if len(places) > 1:
            again[field.name] = places
    return again


def test_each_default_is_written_once() -> None:
    assert written_more_than_once(ROOT) == {}


def test_the_count_sees_a_second_copy(tmp_path: Path) -> None:
    """The check can fail: a parameter default and a flag default repeating fields' values."""
    engine = tmp_path / "engine"
    engine.mkdir()
    (engine / "core.py").write_text(
        "class EngineConfig:\n    max_lanes: int = setting(32, '--max-lanes')\n"
        "class ServerConfig:\n    send_timeout_s: float = 30.0\n",
        encoding="utf-8",
    )
    assert written_more_than_once(tmp_path) == {}
    (engine / "copy.py").write_text(
        "def lanes(max_lanes: int = 32) -> None: ...\n"
        "parser.add_argument('--send-timeout', default=30.0)\n",
        encoding="utf-8",
    )
    again = written_more_than_once(tmp_path)
    assert set(again) == {"max_lanes", "send_timeout_s"}


def _table_rows() -> dict[str, str]:
    """``rollout serve`` flags table of docs/flags.md: flag -> its default cell."""
    text = (ROOT / "docs" / "flags.md").read_text(encoding="utf-8")
    table = "| flag |" + text.split("\n| flag |", 1)[1].split("\n\n", 1)[0]
    rows: dict[str, str] = {}
    for line in table.splitlines()[2:]:
        names, default = (cell.strip() for cell in line.strip("|").split("|")[:2])
        flag_names = re.findall(r"`(--[a-z-]+)", names)
        defaults = [d.strip() for d in default.split(" / ")]
        if len(defaults) != len(flag_names):
            defaults = defaults[:1] * len(flag_names)
        rows.update(zip(flag_names, defaults, strict=True))
    return rows


def _readme_value(cell: str) -> Any:
    text = cell.strip("`")
    if text in ("off", "—"):
        return None
    try:
        return duration(text)
    except ValueError:
        return text


def test_the_readme_lists_every_flag_with_its_default() -> None:
    rows = _table_rows()
    for cls in flags.FLAGGED:
        for field, flag in flags_of(cls):
            if flag.hidden:
                continue
            assert flag.name in rows, f"docs/flags.md's serve flags table lacks {flag.name}"
            shown = _readme_value(rows[flag.name])
            default = field.default
            if isinstance(default, bool) or default is None or default == "":
                assert shown is None or flag.name in ("--store",), flag.name
            elif isinstance(default, int | float):
                assert shown == default, (flag.name, rows[flag.name], default)
            else:
                assert shown == default, (flag.name, rows[flag.name], default)


def test_limit_table_names_the_fields() -> None:
    """SPEC §13 names EngineConfig/ServerConfig fields: each exists."""
    spec = (ROOT / "SPEC.md").read_text(encoding="utf-8")
    section = spec.split("## 13. Limits", 1)[1].split("\n## ", 1)[0]
    cells = [line.split("|")[3].strip() for line in section.splitlines() if line.startswith("| ")]
    named = {m.group(1) for c in cells if (m := re.fullmatch(r"`(?:ServerConfig\.)?([a-z_]+)`", c))}
    known = {f.name for cls in (EngineConfig, ServerConfig) for f in dataclasses.fields(cls)}
    assert named and named <= known, named - known


# CFG-7: a bad value for each flag, by kind. A flag of a kind of its own names its own; a
# free-text flag (any text names an env var or a model) has none.
NOT_A_FILE = "/nonexistent/cfg-7/file"
OWN_BAD: dict[str, list[str]] = {
    "--host": ["no such host", "--allow-anonymous"],  # past AUTH-10's refusal, to the bind
    "--port": ["70000"],
    "--log-level": ["loud"],
    "--safety-policy": ["loud"],
    "--store": ["bogus://x"],
    "--upstream": ["not a url"],
    "--upstream-key-env": ["CFG_7_UNSET", "--upstream", "http://127.0.0.1:9/v1"],
    "--otel-endpoint": ["nope"],
    "--advertise-url": ["nope"],
    "--mcp-allow-hosts": ["%%"],
    "--node-id": ["not a node id!"],
    **{
        name: [NOT_A_FILE]
        for name in (
            "--tls-cert",
            "--tls-key",
            "--api-keys-file",
            "--admin-keys-file",
            "--config",
            "--ledger",
            "--reasoning-key-file",
        )
    },
}
FREE_TEXT = {"--api-keys-env", "--admin-keys-env", "--upstream-model"}


def _bad_values() -> list[tuple[str, list[str]]]:
    """Every flag of the one settings source (``setting(...)`` fields) with a bad value."""
    cases = []
    for cls in flags.FLAGGED:
        for field, flag in flags_of(cls):
            if flag.name in FREE_TEXT:
                continue
            if isinstance(field.default, bool):  # a switch takes no value
                cases.append((flag.name, [flag.name, "yes"]))
            elif flag.name in OWN_BAD:
                value, *more = OWN_BAD[flag.name]
                cases.append((flag.name, [flag.name, value, *more]))
            else:  # a count, an amount, a duration
                kind = flag.parse or type(field.default)
                assert kind in (int, float, duration), (flag.name, kind)  # else: OWN_BAD
                cases.append((flag.name, [flag.name, "-1"]))
    return cases


@pytest.mark.timeout(600)
async def test_every_flags_bad_value_is_a_usage_error(tmp_path: Path) -> None:
    """CFG-7: `rollout serve` with each flag's bad value exits 2 with a one-line usage error
    on stderr, never a traceback (and never starts serving: the exit comes by itself)."""
    gate = asyncio.Semaphore(3)

    async def check(name: str, argv: list[str]) -> None:
        """One flag's bad value; the first that fails ends the walk (the task group kills the
        other processes on its way out)."""
        async with gate:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "cli", "serve", "--port", "0", "--store", "memory://",
                *argv, cwd=ROOT, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            try:
                _, raw = await asyncio.wait_for(proc.communicate(), 30)
            except TimeoutError:
                raise AssertionError(f"{argv}: accepted, the server kept running") from None
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
        err = raw.decode()
        assert "Traceback" not in err, (argv, err)
        assert proc.returncode == 2, (argv, proc.returncode, err)
        last = err.strip().splitlines()[-1]
        assert last.startswith(("rollout serve: ", "rollout: error: ")), (argv, err)
        assert name in last or "rollout serve: error" not in last, (argv, last)

    cases = _bad_values()
    assert len(cases) + len(FREE_TEXT) == 61  # every flag (test_every_flagged_field_...)
    async with asyncio.TaskGroup() as group:
        for name, argv in cases:
            group.create_task(check(name, argv))


def test_log_levels_are_read_in_any_case() -> None:
    """CFG-7: `--log-level debug` (the ValueError traceback before) is DEBUG; WARN is WARNING;
    a level that is none is argparse's usage error."""
    for given, level in (("debug", "DEBUG"), ("Info", "INFO"), ("warn", "WARNING")):
        assert _parser().parse_args(["serve", "--log-level", given]).log_level == level
    with pytest.raises(SystemExit) as exited:
        _parser().parse_args(["serve", "--log-level", "loud"])
    assert exited.value.code == 2
