"""A stored record's first line: who owns it and whether it is a tombstone, readable without
decoding the record's body (SPEC: OWN-5, STORE-20).

A record is stored as ``rr1 <L|D> <owner or ->\\n`` followed by its JSON body. The owner check
(OWN-2) and the liveness probe (HYD-5) read only this line: a record that cannot be decoded
still names its owner, so it answers another key exactly as an unknown id would, and a backend
that can read a prefix (Redis ``GETRANGE``) probes liveness at a cost independent of the
record's size. Records written before this line existed start with ``{``: their owner and
liveness come from a decode of just those fields (still never the items).
"""

from __future__ import annotations

import enum
from typing import NamedTuple

import msgspec

MAGIC = b"rr1 "
MAX_HEAD = 128  # bytes: an owner digest is 32 hex characters, the line is at most 39
NOBODY = "-"  # the owner field of a record with no owner (an open server, OWN-1)


class AnyOwner(enum.Enum):
    """Reads made for the server itself (or an admin key's delete): no owner check."""

    ANY = "any"


ANY_OWNER = AnyOwner.ANY
OwnerFilter = str | None | AnyOwner  # who asks: a digest, None on an open server, or anyone


class HeadLine(NamedTuple):
    owner: str | None
    deleted: bool
    body_at: int  # where the JSON body starts in the blob


class _Legacy(msgspec.Struct):
    """The fields of a record without a head line that the head would carry."""

    owner: str | None = None
    deleted: bool = False


_LEGACY = msgspec.json.Decoder(_Legacy)


def head_line(owner: str | None, deleted: bool) -> bytes:
    return b"%b%b %b\n" % (MAGIC, b"D" if deleted else b"L", (owner or NOBODY).encode())


def peek(blob: bytes | memoryview) -> HeadLine | None:
    """The head of a stored blob (or of its first ``MAX_HEAD`` bytes); None when it has none
    that can be read: the record is corrupt and its owner unknown."""
    if blob[:1] == b"{":
        return _legacy(blob)
    if bytes(blob[: len(MAGIC)]) != MAGIC:
        return None
    end = bytes(blob[:MAX_HEAD]).find(b"\n")
    if end < 0:
        return None
    flag, _, owner = bytes(blob[len(MAGIC) : end]).partition(b" ")
    if flag not in (b"L", b"D") or not owner:
        return None
    name = owner.decode("ascii", "replace")
    return HeadLine(None if name == NOBODY else name, flag == b"D", end + 1)


def _legacy(blob: bytes | memoryview) -> HeadLine | None:
    try:
        fields = _LEGACY.decode(blob)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return HeadLine(fields.owner, fields.deleted, 0)


def readable_by(head: HeadLine | None, owner: OwnerFilter) -> bool:
    """May ``owner`` see this record at all (OWN-2)? A record whose owner cannot be read is
    nobody's on a server with keys; an open server shares everything, corrupt records too."""
    if owner is ANY_OWNER:
        return True
    if head is None:
        return owner is None
    return head.owner == owner
