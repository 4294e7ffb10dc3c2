"""``rollout serve``'s flags, generated from the config dataclasses' fields (SPEC: CFG-6).

Each flag is a field of ``ServeOptions`` (how to listen and where things are), ``EngineConfig``
(engine limits) or ``ServerConfig`` (transport limits), declared with ``engine.settings.setting``:
the field holds the default, the help and the unit, and nothing here writes one again. A flag's
``dest`` is its field's name, so a config is built from the parsed arguments in one step, and
built once: nothing changes it afterwards.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from engine.core import EngineConfig
from engine.server.process.workers import WORKER_FLAG
from engine.server.transport.server_config import ServerConfig, load_api_keys, load_key_limits
from engine.settings import Flag, flags_of, log_level, port, setting
from engine.store import DEFAULT_MAX_RECORD_BYTES

NETWORK, STORE, PROCESSES, MODELS = "network", "store", "processes", "models"
GROUPS = (NETWORK, "limits", STORE, PROCESSES, "engine", MODELS)  # --help's sections, in order
C = TypeVar("C")


@dataclass(frozen=True)
class ServeOptions:
    """What ``rollout serve`` needs besides the engine's and the transport's limits."""

    host: str = setting("127.0.0.1", "--host", help="listen address", group=NETWORK)
    port: int = setting(
        8000, "--port", help="listen port (0: a free one)", group=NETWORK, parse=port
    )
    tls_cert: Path | None = setting(
        None, "--tls-cert", help="PEM certificate: serve https/wss", group=NETWORK, parse=Path
    )
    tls_key: Path | None = setting(
        None, "--tls-key", help="PEM private key for --tls-cert", group=NETWORK, parse=Path
    )
    api_keys_file: Path | None = setting(
        None,
        "--api-keys-file",
        help="one API key per line, optionally with its limits (RATE-1)",
        group=NETWORK,
        parse=Path,
    )
    api_keys_env: str = setting(
        "ROLLOUT_API_KEYS",
        "--api-keys-env",
        help="env var with comma-separated API keys",
        group=NETWORK,
    )
    admin_keys_file: Path | None = setting(
        None, "--admin-keys-file", help="operator keys, one per line (AUTH-4)", group=NETWORK,
        parse=Path,
    )  # fmt: skip
    admin_keys_env: str = setting(
        "ROLLOUT_ADMIN_KEYS",
        "--admin-keys-env",
        help="env var with comma-separated operator keys (AUTH-4)",
        group=NETWORK,
    )
    allow_anonymous: bool = setting(
        False,
        "--allow-anonymous",
        help="serve without API keys on a non-loopback address (AUTH-10; otherwise refused)",
        group=NETWORK,
    )
    backlog: int = setting(128, "--backlog", help="listen queue of pending connects", group=NETWORK)
    announce_port: bool = setting(
        False,
        "--announce-port",
        help="once listening, print 'PORT <n>' on stdout (the bound port, for --port 0)",
        group=NETWORK,
    )
    store: str | None = setting(
        None,
        "--store",
        help="sqlite:///PATH (default: ~/.local/share/rollout/rollout.db; options "
        "?synchronous=normal|full|extra, ?inline=on|off, ?deadline=SECONDS (10)), "
        "redis://HOST:PORT/DB, rediss://…, postgresql://USER@HOST:PORT/DB, memory://",
        group=STORE,
        metavar="URL",
    )
    store_max_record_bytes: int = setting(
        DEFAULT_MAX_RECORD_BYTES,
        "--store-max-record-bytes",
        help="largest stored response record (LIM-20)",
        group=STORE,
        unit="bytes",
    )
    workers: int = setting(
        1,
        "--workers",
        help="server processes sharing the port (SO_REUSEPORT) and the store (WORK-1)",
        group=PROCESSES,
    )
    worker_index: int | None = setting(None, WORKER_FLAG, group=PROCESSES, parse=int, hidden=True)
    log_level: str = setting(
        "INFO",
        "--log-level",
        help="Python logging level (debug, info, warning, error, critical; any case)",
        group="engine",
        parse=log_level,
    )
    config: Path | None = setting(
        None, "--config", help="model routing file (TOML, CFG-1)", group=MODELS, parse=Path
    )
    upstream: str | None = setting(
        None, "--upstream", help="OpenAI-compatible base URL, e.g. …/v1 (CFG-5)", group=MODELS
    )
    upstream_model: str | None = setting(
        None, "--upstream-model", help="model name sent upstream", group=MODELS
    )
    upstream_key_env: str | None = setting(
        None, "--upstream-key-env", help="env var holding the upstream key", group=MODELS
    )
    bench_models: bool = setting(
        False,
        "--bench-models",
        help="add the benchmark's models (bench-coding-agent/N, bench-text/N) to the simulator",
        group=MODELS,
    )


FLAGGED = (ServeOptions, EngineConfig, ServerConfig)  # every class whose fields are flags


def add_serve_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "serve", help="run the Responses API server (simulated model by default)"
    )
    groups = {name: parser.add_argument_group(name) for name in GROUPS}
    for cls in FLAGGED:
        for field, flag in flags_of(cls):
            _add_flag(groups[flag.group], field, flag)


def _add_flag(group: argparse._ArgumentGroup, field: dataclasses.Field[Any], flag: Flag) -> None:
    default = field.default
    options: dict[str, Any] = {"dest": field.name, "default": default}
    if isinstance(default, bool):  # a switch: it sets the opposite of the default
        options["action"] = "store_false" if default else "store_true"
    else:
        options["type"] = _reader(flag.parse or (str if default is None else type(default)))
        if flag.choices:
            options["choices"] = flag.choices  # argparse shows them as the value's name
        else:  # argparse would name the value after the dest (the field); the flag reads better
            options["metavar"] = flag.metavar or flag.name.lstrip("-").replace("-", "_").upper()
    options["help"] = argparse.SUPPRESS if flag.hidden else _help(flag, default)
    group.add_argument(flag.name, **options)


def _help(flag: Flag, default: object) -> str:
    if isinstance(default, bool) or default is None:
        return flag.help
    unit = f" {flag.unit}" if flag.unit else ""
    whole = isinstance(default, float) and default.is_integer()  # 3600, not 3600.0
    shown = str(int(default)) if isinstance(default, float) and whole else str(default)
    return f"{flag.help} (default: {shown}{unit})".replace("%", "%%")


def _reader(parse: Any) -> Any:
    """argparse's ``type``: every bad value is a usage error (exit 2), never a traceback. A
    count or an amount is a number, 0 or more (argparse's own "invalid int value" for text that
    is none); a reader of ours (a duration, a port, a log level) tells what is wrong."""
    if parse is int or parse is float:
        return _amount(parse)
    if parse is str or parse is Path:
        return parse

    def read(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    read.__name__ = parse.__name__
    return read


def _amount(kind: type[int] | type[float]) -> Any:
    def read(text: str) -> int | float:
        value = kind(text)  # ValueError: argparse's "invalid int value: 'x'"
        if not (math.isfinite(value) and value >= 0):
            raise argparse.ArgumentTypeError(f"not a number of 0 or more: {text!r}")
        return value

    read.__name__ = kind.__name__
    return read


def _from_args(cls: type[C], args: argparse.Namespace, **fixed: Any) -> C:
    values = {field.name: getattr(args, field.name) for field, _ in flags_of(cls)}
    return cls(**values, **fixed)


def serve_options(args: argparse.Namespace) -> ServeOptions:
    return _from_args(ServeOptions, args)


def engine_config(args: argparse.Namespace, default_model: str | None = None) -> EngineConfig:
    """The engine's limits; ``default_model`` is the routing config's (CFG-4), when it has one."""
    fixed = {} if default_model is None else {"default_model": default_model}
    return _from_args(EngineConfig, args, **fixed)


def server_config(args: argparse.Namespace) -> ServerConfig:
    """Raises ``OSError`` when ``--api-keys-file`` cannot be read, ``ValueError`` when a limit
    in it is not one (RATE-1)."""
    options = serve_options(args)
    keys = load_api_keys(options.api_keys_file, options.api_keys_env)
    admins = load_api_keys(options.admin_keys_file, options.admin_keys_env)
    limits = load_key_limits(options.admin_keys_file) | load_key_limits(options.api_keys_file)
    return _from_args(ServerConfig, args, api_keys=keys, admin_keys=admins, key_limits=limits)
