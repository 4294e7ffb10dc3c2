"""What an object really holds in memory, in bytes (SPEC: MEM-10, MEM-11).

The caches that keep conversations (the hydration cache, the parking lot) are bounded in bytes;
a bound is only worth the count it compares. A message's encoded JSON is not what it costs: each
decoded item is a struct, each string a Python object with a header (49 bytes for ASCII, 73 for
a non-ASCII one), each list and dict its own table, and the context keeps ledgers (``by_id``,
``calls``) and a token buffer with spare capacity. Counting the encoded size undercounted the
real footprint about 2.5x (issue 24: 132 MB counted, 336 MB of RSS growth).

``deep_size`` (``protocol/footprint.py``) walks an item once when it is committed
(``sys.getsizeof`` of every object it reaches, the way CPython's allocator sees them); a
request's toolset is measured once when it is built (``Toolset.nbytes``).
``tests/engine/test_footprint.py`` checks what a context is charged against what tracemalloc
sees publishing it allocate, from both sides; ``tests/server/bounds/
test_memory_budget_functional.py`` a real server's RSS against the cache's count.
"""

from __future__ import annotations

import sys

import msgspec

from protocol.footprint import deep_size as deep_size  # the walk lives with the wire types

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
# test_footprint.py measures it.) A toolless request's empty toolset is in it; the instructions'
# string is charged beside it (the 58 bytes of the tests' "Be brief." were in it: 1,408 ->
# 1,350), and a request's tools their ``Toolset.nbytes``.
CONTEXT_OVERHEAD = 1350

# An encoded item kept for the upstream (``Context.wire``, UP-RESP-6): the ``msgspec.Raw``
# object and its ``bytes`` object's header (33 bytes), on top of the JSON itself.
WIRE_ENTRY_OVERHEAD = sys.getsizeof(msgspec.Raw(b"")) + sys.getsizeof(b"")
