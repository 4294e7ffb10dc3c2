"""A configuration field's one source: its default, its ``rollout serve`` flag, help and unit.

The config dataclasses (``EngineConfig``, ``ServerConfig``, ``ServeOptions``) declare each field
with :func:`setting`; ``engine/server/process/flags.py`` generates the serve flags from that
metadata, so a default is written once, next to the field it belongs to (SPEC: CFG-6). A leaf: it
imports nothing of the engine, so every part, the store included, may use it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

FLAG = "rollout.flag"  # the key of a field's Flag in its dataclass metadata
T = TypeVar("T")


@dataclass(frozen=True)
class Flag:
    """How a field is set from the command line.

    A ``bool`` field is a switch that sets the opposite of its default. ``parse`` reads the
    text (default: the type of the default value); ``group`` is the help section."""

    name: str
    help: str
    group: str
    unit: str = ""
    parse: Callable[[str], Any] | None = None
    choices: tuple[str, ...] = ()
    metavar: str | None = None
    hidden: bool = False  # internal (a worker's index), not shown in --help


def setting(
    default: T,
    flag: str | None = None,
    *,
    help: str = "",
    group: str = "",
    unit: str = "",
    parse: Callable[[str], Any] | None = None,
    choices: tuple[str, ...] = (),
    metavar: str | None = None,
    hidden: bool = False,
) -> T:
    """A dataclass field with its default and, when ``flag`` is given, its serve flag."""
    if flag is None:
        return dataclasses.field(default=default)
    meta = Flag(flag, help, group, unit, parse, choices, metavar, hidden)
    # typed as the default so ``x: int = setting(16, ...)`` reads like ``x: int = 16``
    field: T = dataclasses.field(default=default, metadata={FLAG: meta})
    return field


def flags_of(cls: type[Any]) -> list[tuple[dataclasses.Field[Any], Flag]]:
    """The fields of a config dataclass that have a flag, in declaration order."""
    return [(f, f.metadata[FLAG]) for f in dataclasses.fields(cls) if FLAG in f.metadata]


def duration(text: str) -> float:
    """``3600``, ``90s``, ``45m``, ``12h`` or ``30d`` as seconds (``--store-ttl``)."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    scale = units.get(text[-1:].lower(), 0)
    try:
        value = float(text[:-1] if scale else text) * (scale or 1)
    except ValueError:
        raise ValueError(f"not a duration: {text!r}") from None
    if value < 0:
        raise ValueError("a duration is not negative")
    return value


LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def log_level(text: str) -> str:
    """A Python logging level by name, in any case (``debug``, ``INFO``; ``warn`` is
    ``warning``), as logging spells it (``--log-level``)."""
    name = text.strip().lower()
    name = "warning" if name == "warn" else name
    if name not in LOG_LEVELS:
        raise ValueError(f"not a log level ({', '.join(LOG_LEVELS)}): {text!r}")
    return name.upper()


def port(text: str) -> int:
    """A TCP port, 0 (any free one) to 65535 (``--port``)."""
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"not a port: {text!r}") from None
    if not 0 <= value <= 65535:
        raise ValueError(f"not a port (0 to 65535): {text!r}")
    return value


def url(text: str) -> str:
    """An ``http://`` or ``https://`` base URL with a host, or empty for none
    (``--otel-endpoint``, ``--advertise-url``)."""
    scheme, sep, rest = text.partition("://")
    if text and not (sep and scheme.lower() in ("http", "https") and rest.strip("/")):
        raise ValueError(f"not an http:// or https:// URL: {text!r}")
    return text
