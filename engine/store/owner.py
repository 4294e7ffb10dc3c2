"""Owner digests (SPEC: OWN-1, OWN-6): what a record keeps instead of the API key."""

from __future__ import annotations

import hashlib
import hmac

SALT_BYTES = 16


def digest(salt: bytes, api_key: str) -> str:
    """HMAC-sha256 of the key under the store's salt, first 128 bits in hex: the same key gets
    another digest in every store, so digests cannot be matched across deployments."""
    return hmac.new(salt, api_key.encode(), hashlib.sha256).hexdigest()[:32]
