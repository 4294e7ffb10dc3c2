"""What SPEC's rule IDs look like and where they are defined: shared by the tests that hold
citations to them (tests/test_spec_ids.py, tests/test_citations.py)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
ID = re.compile(r"(?<![\w-])((?:[A-Z]{2,}-)+\d+)\b")
DEFINITION = re.compile(r"\*\*((?:[A-Z]{2,}-)+\d+)\*\*")
# Strings that look like rule IDs but are not: encodings, ciphers and digests, model families,
# RFC 5737's documentation networks, and the coding scenario's bug markers.
NOT_RULES = re.compile(r"^(UTF-\d+|BUG-\d+|AES-\d+|(HMAC-)?SHA-\d+|GPT-\d+|TEST-NET-\d+)$")


def rule_documents() -> list[Path]:
    return [ROOT / "SPEC.md", *sorted((ROOT / "docs").glob("*.md"))]


def definitions() -> Counter[str]:
    """Each rule ID defined (in bold) in SPEC.md or docs/, with how many times."""
    found: Counter[str] = Counter()
    for doc in rule_documents():
        found.update(DEFINITION.findall(doc.read_text(encoding="utf-8")))
    return found
