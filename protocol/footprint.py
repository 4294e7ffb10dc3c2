"""What a decoded object really holds in memory, in bytes (SPEC: MEM-10).

``deep_size`` sums ``sys.getsizeof`` of every object a value reaches (structs, strings, lists,
dicts), the way CPython's allocator sees them. The engine walks each committed item once with
it (``engine/conversation/footprint.py``); a request's toolset is measured once, when it is
built (``protocol.tools.toolset_of``), so a context that keeps it is charged without a walk.
"""

from __future__ import annotations

import sys
from typing import Any

import msgspec
from msgspec.structs import astuple

# Objects the interpreter shares: never charged to an item.
_SHARED = (type(None), bool)
# msgspec decodes a dict key of up to 32 ASCII characters through its key cache: one string
# shared by every dict that has the key (a JSON schema's "type", "properties", "description").
_CACHED_KEY = 32


def deep_size(obj: object) -> int:
    """Bytes ``obj`` and everything it holds occupy (shared singletons excluded)."""
    return _walk(obj, 0, False)


def schema_size(obj: object) -> int:
    """``deep_size`` of a value msgspec decoded whose dicts are many (a tool's JSON schema):
    a dict's keys msgspec's key cache shares are not charged to it, only its entries."""
    return _walk(obj, 0, True)


def _walk(obj: Any, depth: int, cached_keys: bool) -> int:
    """The one walk: with ``cached_keys`` a dict key msgspec's key cache shares is not charged."""
    if isinstance(obj, _SHARED):
        return 0
    size = sys.getsizeof(obj)
    if isinstance(obj, (str, bytes, int, float)) or depth > 32:
        return size
    depth += 1
    if isinstance(obj, msgspec.Struct):
        for value in astuple(obj):  # the fields' values in one call (~25% under getattr each)
            if value.__class__ is str:  # the usual field, measured inline (no call)
                size += sys.getsizeof(value)
            elif value is not None:
                size += _walk(value, depth, cached_keys)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            size += _walk(value, depth, cached_keys)
    elif isinstance(obj, dict):
        for key, value in obj.items():
            if not (
                cached_keys and key.__class__ is str and len(key) <= _CACHED_KEY and key.isascii()
            ):
                size += _walk(key, depth, cached_keys)
            size += _walk(value, depth, cached_keys)
    return size
