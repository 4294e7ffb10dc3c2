"""A registry of one extension point: name -> class, each imported on first use (SPEC: TOK-2,
TOK-6, REASON-1, HARMONY-1).

The model formats of a ``tokens`` route are named in its config (``api``, ``template``,
``tool_parser``, ``reasoning_parser``) and looked up here, never dispatched by comparing names:
a format is one module with one class, and one line in its registry names it
(``"name": "module:Class"``). A format's module is imported when a route first names it, so a
server or encoding nobody routes to costs nothing (vLLM's ``tool_parsers/__init__.py`` keeps
its parsers the same way).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Registry(Mapping[str, type[T]], Generic[T]):
    """``name -> class``, each a subclass of ``base``, imported when first asked for."""

    def __init__(self, base: type[Any], entries: dict[str, str]) -> None:
        self._base = base
        self._entries = entries  # name -> "module:Class"
        self._loaded: dict[str, type[T]] = {}

    def __getitem__(self, name: str) -> type[T]:
        loaded = self._loaded.get(name)
        if loaded is None:
            module, _, attribute = self._entries[name].partition(":")
            found = getattr(importlib.import_module(module), attribute)
            if not (isinstance(found, type) and issubclass(found, self._base)):
                raise TypeError(f"{self._entries[name]} is not a {self._base.__name__}")
            loaded = self._loaded[name] = found
        return loaded

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def known(self) -> str:
        """The names, for an error that lists them."""
        return ", ".join(sorted(self._entries))
