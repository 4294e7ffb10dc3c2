"""Safety scan over every text the model will read (SPEC: PIPE-2).

A credential/secret detector: patterns are compiled once into one alternation, so the cost is a
single linear pass per text. Findings are recorded, never used to drop content silently.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_PATTERNS: dict[str, str] = {
    "openai_api_key": r"sk-(?:proj-)?[A-Za-z0-9_\-]{20,}",
    "aws_access_key_id": r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",
    "github_token": r"\bgh[pousr]_[A-Za-z0-9]{36,}\b",
    "slack_token": r"\bxox[abprs]-[A-Za-z0-9-]{10,}",
    "private_key": r"-----BEGIN (?:RSA |EC |OPENSSH |DSA |ENCRYPTED )?PRIVATE KEY-----",
    "google_api_key": r"\bAIza[0-9A-Za-z_\-]{35}\b",
}
_SCANNER = re.compile("|".join(f"(?P<{name}>{rx})" for name, rx in _PATTERNS.items()))


@dataclass(frozen=True, slots=True)
class Finding:
    kind: str
    item_index: int  # index of the item in the rollout's context


def scan_text(text: str, item_index: int) -> list[Finding]:
    return [
        Finding(kind=m.lastgroup or "secret", item_index=item_index)
        for m in _SCANNER.finditer(text)
    ]
