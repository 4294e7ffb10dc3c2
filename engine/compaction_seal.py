"""How this server seals its own compaction summaries into ``encrypted_content`` (COMPACT-2).

``rcmp1.`` + base64url(UTF-8 summary): opaque to clients, readable by the renderer. Kept apart
from ``engine.compaction`` because the renderer needs it and ``compaction`` needs the pipeline.
"""

from __future__ import annotations

import base64
import binascii
import hashlib

from protocol.items import Compaction

SEAL = "rcmp1."


def seal(summary: str) -> str:
    return SEAL + base64.urlsafe_b64encode(summary.encode()).decode()


def unseal(blob: str) -> str | None:
    """The summary this server sealed, or None for an upstream's (or a client's) own blob."""
    if not blob.startswith(SEAL):
        return None
    try:
        raw = base64.b64decode(blob[len(SEAL) :].encode(), altchars=b"-_", validate=True)
        return raw.decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None


def summary_text(item: Compaction) -> str:
    """What the model reads for a compaction item (render, chat upstream)."""
    summary = unseal(item.encrypted_content)
    if summary is not None:
        return summary
    tag = hashlib.sha1(item.encrypted_content.encode(), usedforsecurity=False).hexdigest()[:12]
    return f"[compacted context {tag}]"
