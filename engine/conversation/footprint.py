"""What an object really holds in memory, in bytes (SPEC: MEM-10, MEM-11).

The caches that keep conversations (the hydration cache, the parking lot) are bounded in bytes;
a bound is only worth the count it compares. A message's encoded JSON is not what it costs: each
decoded item is a struct, each string a Python object with a header (49 bytes for ASCII, 73 for
a non-ASCII one), each list and dict its own table, and the context keeps ledgers (``by_id``,
``calls``) and a token buffer with spare capacity. Counting the encoded size undercounted the
real footprint about 2.5x (issue 24: 132 MB counted, 336 MB of RSS growth).

``deep_size`` walks an item once when it is committed (``sys.getsizeof`` of every object it
reaches, the way CPython's allocator sees them). ``tests/engine/test_footprint.py`` checks what
a context is charged against what tracemalloc sees publishing it allocate, from both sides;
``tests/server/bounds/test_memory_budget_functional.py`` a real server's RSS against the cache's
count.
"""

from __future__ import annotations

import sys
from typing import Any

import msgspec
from msgspec.structs import astuple

# What a dict entry costs on top of its key and value (index slot + 24-byte entry, with the
# table's load factor), and a list or set slot; the ledger entries of ``Context`` are these.
DICT_ENTRY = 48
LIST_SLOT = 8
SET_ENTRY = 24

# The fixed part of a Context (the object and its attribute dict, the token buffer's object, its
# empty dicts/sets/lists, the header array's object): what tracemalloc sees a one-message
# context hold besides its item and its arrays' data, about 1.4 KiB. (It was 2 KiB, which
# overcharged a one-message context 13%; then 1,280 bytes, measured beside a 4 KiB token buffer
# that hid its 168-byte shortfall: 0.91 once the buffer starts small. tests/engine/
# test_footprint.py measures it.)
CONTEXT_OVERHEAD = 1408

# An encoded item kept for the upstream (``Context.wire``, UP-RESP-6): the ``msgspec.Raw``
# object and its ``bytes`` object's header (33 bytes), on top of the JSON itself.
WIRE_ENTRY_OVERHEAD = sys.getsizeof(msgspec.Raw(b"")) + sys.getsizeof(b"")

# Objects the interpreter shares: never charged to an item.
_SHARED = (type(None), bool)


def deep_size(obj: object) -> int:
    """Bytes ``obj`` and everything it holds occupy (shared singletons excluded)."""
    return _walk(obj, 0)


def _walk(obj: Any, depth: int) -> int:
    if isinstance(obj, _SHARED):
        return 0
    size = sys.getsizeof(obj)
    if isinstance(obj, (str, bytes, int, float)) or depth > 32:
        return size
    if isinstance(obj, msgspec.Struct):
        for value in astuple(obj):  # the fields' values in one call (~25% under getattr each)
            if value.__class__ is str:  # the usual field, measured inline (no call)
                size += sys.getsizeof(value)
            elif value is not None:
                size += _walk(value, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            size += _walk(value, depth + 1)
    elif isinstance(obj, dict):
        for key, value in obj.items():
            size += _walk(key, depth + 1) + _walk(value, depth + 1)
    return size
