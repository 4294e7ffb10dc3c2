"""Reasoning that travels sealed (SPEC §10.9: SEAL-1..SEAL-8).

``include: ["reasoning.encrypted_content"]`` gives each reasoning item an ``encrypted_content``
blob: AES-GCM (256-bit key) over the reasoning text and, on ``tokens`` routes, the exact ids of the
sampled run it belongs to, so a stateless continuation (``store: false``, the whole input
again) renders what the model sampled without any store, on any node holding the key.

A blob reads ``rseal1.<key id>.<nonce>.<ciphertext>`` (base64url, no padding). Its associated
data binds it to the version, the key id, the owner (the API key's digest; one tenant's blob is
foreign to another) and the reasoning item's id. Keys come from ``--reasoning-key-file`` (one
key a line: the first seals, every one opens, so keys rotate); without one a random key per
process seals, and blobs then neither survive a restart nor cross nodes or workers (a warning
says so at startup).

Sealed on output (``engine/rollout/sampling.py``), opened on input by the pre-inference
pipeline (``pipeline.py``): the opened run waits in ``Context.sealed`` for the backend that
renders the model's own tokens.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import msgspec
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

log = logging.getLogger("rollout.sealed")

VERSION = "rseal1"  # SEAL-2: the format's version, the blob's first field
PREFIX = VERSION + "."
KEY_BYTES = 32  # a 256-bit AES key
NONCE_BYTES = 12
INCLUDE = "reasoning.encrypted_content"


class SealedReasoning(msgspec.Struct, array_like=True, omit_defaults=True):
    """What a blob holds (SEAL-3). ``ids``: the sampled run's ids exactly (``tokens`` routes,
    a run that ended with its end: stop or tool calls); ``lead``: the run's items before this
    reasoning item, ``items``: the run's items from it; ``model``: the route that sampled."""

    text: str
    model: str = ""
    ids: list[int] | None = None
    lead: int = 0
    items: int = 0


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(SealedReasoning)


@dataclass(frozen=True)
class SealedRun:
    """An opened run, waiting in ``Context.sealed`` under the index of its first item."""

    ids: list[int]
    items: int  # context items it stands for, from its first
    model: str


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def parse_key(line: str) -> bytes:
    """A key: 32 bytes as 64 hex digits or base64 (standard or url-safe)."""
    text = line.strip()
    try:
        key = (
            bytes.fromhex(text)
            if len(text) == 2 * KEY_BYTES
            else _unb64(text.replace("+", "-").replace("/", "_"))
        )
    except (ValueError, binascii.Error):
        raise ValueError("a reasoning key is 32 bytes, as 64 hex digits or base64") from None
    if len(key) != KEY_BYTES:
        raise ValueError("a reasoning key is 32 bytes, as 64 hex digits or base64")
    return key


class KeyRing:
    """The sealing keys (SEAL-5): the first seals, every one opens."""

    def __init__(self, keys: list[bytes], ephemeral: bool = False) -> None:
        if not keys:
            raise ValueError("a key ring holds at least one key")
        self._keys = {self.key_id(k): AESGCM(k) for k in keys}
        self._sealing = self.key_id(keys[0])
        self.ephemeral = ephemeral

    @staticmethod
    def key_id(key: bytes) -> str:
        """Names a key without revealing it: 8 hex digits of its sha256."""
        return hashlib.sha256(b"rseal key id\x00" + key).hexdigest()[:8]

    @classmethod
    def from_file(cls, path: Path | None) -> KeyRing:
        """``--reasoning-key-file``'s keys (blank lines and ``#`` comments skipped); none: a
        random key for this process (``rollout serve`` warns at start, ``warn_ephemeral``).
        An unreadable file or a bad key is ``OSError`` / ``ValueError``."""
        if path is None:
            return cls([os.urandom(KEY_BYTES)], ephemeral=True)
        lines = path.read_text().splitlines()
        keys = [parse_key(s) for s in lines if s.strip() and not s.lstrip().startswith("#")]
        if not keys:
            raise ValueError(f"{path}: no reasoning key in the file")
        return cls(keys)

    @staticmethod
    def _aad(kid: str, owner: str | None, item_id: str) -> bytes:
        return "\x00".join((VERSION, kid, owner or "", item_id)).encode()

    def seal(self, content: SealedReasoning, owner: str | None, item_id: str) -> str:
        kid = self._sealing
        nonce = os.urandom(NONCE_BYTES)
        data = self._keys[kid].encrypt(
            nonce, _ENCODER.encode(content), self._aad(kid, owner, item_id)
        )
        return f"{PREFIX}{kid}.{_b64(nonce)}.{_b64(data)}"

    def open(self, blob: str, owner: str | None, item_id: str) -> SealedReasoning | None:
        """The content, or None when the blob is not ours to open (tampered, truncated, sealed
        under a key not in the ring, for another owner or another item)."""
        parts = blob.split(".")
        if len(parts) != 4 or parts[0] != VERSION:
            return None
        _, kid, nonce_text, data_text = parts
        aead = self._keys.get(kid)
        if aead is None:
            return None
        try:
            nonce = _unb64(nonce_text)
            if len(nonce) != NONCE_BYTES:
                return None
            plain = aead.decrypt(nonce, _unb64(data_text), self._aad(kid, owner, item_id))
            return _DECODER.decode(plain)
        except (InvalidTag, ValueError, binascii.Error, msgspec.DecodeError):
            return None


def warn_ephemeral() -> None:
    """SEAL-5's startup warning, when no key file is named."""
    log.warning(
        "no --reasoning-key-file: reasoning is sealed with a random per-process key; sealed "
        "blobs will not survive a restart, nor open on another node or worker (SEAL-5)"
    )


def is_sealed(blob: str | None) -> bool:
    """Ours to open (SEAL-6): anything else is someone else's opaque blob (ITEM-5)."""
    return blob is not None and blob.startswith(PREFIX)
