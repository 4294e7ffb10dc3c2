"""Every rule ID that code, tests or docs cite is defined once in SPEC.md or docs/ (SPEC preamble).

A rule is defined where it appears in bold (`**WS-4**`); a citation elsewhere that names no
defined rule is a dangling reference, which is how a renumbered or deleted rule shows up.
"""

from __future__ import annotations

from tests.support.rules import ID, NOT_RULES, ROOT
from tests.support.rules import definitions as _definitions

SOURCE_DIRS = ("protocol", "engine", "clients", "tests", "cli")


def _citations() -> dict[str, str]:
    cited: dict[str, str] = {}
    for top in SOURCE_DIRS:
        for path in sorted((ROOT / top).rglob("*.py")):
            for rule in ID.findall(path.read_text(encoding="utf-8")):
                if not NOT_RULES.match(rule):
                    cited.setdefault(rule, str(path.relative_to(ROOT)))
    return cited


def test_every_cited_rule_is_defined() -> None:
    defined = _definitions()
    dangling = {rule: where for rule, where in _citations().items() if rule not in defined}
    assert not dangling, f"cited but not defined in SPEC.md or docs/: {dangling}"


def test_every_rule_is_defined_once() -> None:
    twice = sorted(rule for rule, count in _definitions().items() if count > 1)
    assert not twice, f"defined more than once: {twice}"


def test_every_registered_mutation_still_applies_and_names_a_rule() -> None:
    """``tools/mutants.toml``: a mutation whose text no longer occurs once in its file is never
    run (``make mutants`` says NOT APPLIED), so a refactor would silently retire it; and its
    rule is one the SPEC or docs define (or ``clients``, the README's client package)."""
    import tomllib

    defined = _definitions()
    with (ROOT / "tools" / "mutants.toml").open("rb") as f:
        mutations = tomllib.load(f)["mutation"]
    stale = {}
    for m in mutations:
        path = ROOT / m["file"]
        count = path.read_text(encoding="utf-8").count(m["old"]) if path.exists() else -1
        if count != 1:
            stale[m["name"]] = count
    assert not stale, f"mutations whose text is not exactly once in their file: {stale}"
    unknown = {m["name"]: m["rule"] for m in mutations if m["rule"] not in defined}
    assert set(unknown.values()) <= {"clients"}, unknown
