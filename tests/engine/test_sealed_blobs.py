"""Sealed reasoning blobs as a property (SEAL-2, SEAL-3, SEAL-7): what is sealed opens as it
was, for its owner and item only; any truncation and any changed character either fails to
open or (a base64 character whose changed bits are padding) opens to the very same content."""

from __future__ import annotations

import base64
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.conversation.sealed import KeyRing, SealedReasoning, is_sealed, parse_key

RING = KeyRing([os.urandom(32)])
contents = st.builds(
    SealedReasoning,
    text=st.text(max_size=200),
    model=st.text(max_size=20),
    ids=st.none() | st.lists(st.integers(0, 2**31 - 1), max_size=50),
    lead=st.integers(0, 5),
    items=st.integers(0, 5),
)
owners = st.none() | st.text(max_size=40)


@given(contents, owners, st.text(min_size=1, max_size=30))
def test_a_blob_opens_as_sealed_for_its_owner_and_item_only(
    content: SealedReasoning, owner: str | None, item_id: str
) -> None:
    blob = RING.seal(content, owner, item_id)
    assert is_sealed(blob) and blob.count(".") == 3
    assert RING.open(blob, owner, item_id) == content
    assert RING.open(blob, (owner or "") + "x", item_id) is None
    assert RING.open(blob, owner, item_id + "x") is None


@given(contents, st.data())
def test_truncated_or_changed_blobs_do_not_open(
    content: SealedReasoning, data: st.DataObject
) -> None:
    blob = RING.seal(content, "owner", "rs_1")
    cut = data.draw(st.integers(0, len(blob) - 1), label="cut")
    assert RING.open(blob[:cut], "owner", "rs_1") is None
    at = data.draw(st.integers(0, len(blob) - 1), label="at")
    char = data.draw(st.characters(codec="ascii").filter(lambda c: c != blob[at]), label="char")
    opened = RING.open(blob[:at] + char + blob[at + 1 :], "owner", "rs_1")
    assert opened is None or opened == content


def test_keys_are_hex_or_base64_of_32_bytes() -> None:
    key = os.urandom(32)
    assert parse_key(key.hex()) == key
    assert parse_key(base64.b64encode(key).decode()) == key
    assert parse_key(base64.urlsafe_b64encode(key).decode().rstrip("=")) == key
    for bad in ("", "00" * 31, "not a key"):
        with pytest.raises(ValueError, match="32 bytes"):
            parse_key(bad)
