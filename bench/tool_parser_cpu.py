"""Parser CPU per 1,000 sampled tokens, per registered tool parser (issue 23's figure).

    .venv/bin/python -m bench.tool_parser_cpu [--repeat N]

Each parser in the registry is fed, one token's text at a time (cl100k pieces of ASCII text, as
the decoder hands them over), two answers of about 1,000 tokens in its own format (its
``sample``): ``calls`` (a sentence, then tool calls with a few arguments, repeated) and
``prose`` (plain text, no call). The CPU
time (``time.process_time``) of ``feed`` and ``finish`` is divided by the tokens fed."""

from __future__ import annotations

import argparse
import time

from engine.conversation.tokens import encoding
from engine.models.tokens.tool_parsers import PARSERS, ToolSchemas

ARGS = {"path": "src/engine/models/tokens/backend.py", "line": 128, "replace": True}
SCHEMAS: ToolSchemas = {
    "edit_file": {
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "line": {"type": "integer"},
            "replace": {"type": "boolean"},
        },
    }
}
PROSE = (
    "I read the failing test and the module it covers. The decoder drops the tag, so the "
    "parser never sees the call; the fix keeps the marker and hides only control tokens. "
)


ANSWER_SIZE = 1000  # tokens fed per answer


def answer(parser: str, kind: str) -> list[str]:
    """About ``ANSWER_SIZE`` token pieces of an answer (``calls`` or ``prose``): the parser's
    own sample call of ``edit_file(ARGS)``, after a sentence each unless the format reads an
    answer as calls only."""
    enc = encoding()
    fmt = PARSERS[parser]
    if kind == "prose":
        unit = PROSE
    else:
        call = fmt.sample("edit_file", ARGS) + fmt.sample_separator
        unit = PROSE + call if fmt.sample_prose else call
    per_unit = len(enc.encode_ordinary(unit))
    text = unit * max(1, ANSWER_SIZE // per_unit)
    if kind == "calls" and not fmt.sample_prose:
        text = text.removesuffix(fmt.sample_separator)
    return [enc.decode([i]) for i in enc.encode_ordinary(text)]


def cpu_per_1000(parser: str, pieces: list[str], repeat: int) -> float:
    """Seconds of CPU per 1,000 pieces fed (best of ``repeat`` runs)."""
    factory = PARSERS[parser]
    best = float("inf")
    for _ in range(repeat):
        started = time.process_time()
        instance = factory(SCHEMAS)
        for piece in pieces:
            instance.feed(piece)
        instance.finish()
        best = min(best, time.process_time() - started)
    return best * 1000 / len(pieces)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeat", type=int, default=20, help="runs per figure (best is kept)")
    args = parser.parse_args(argv)
    print(f"{'parser':<12} {'answer':<6} {'tokens':>6} {'calls':>5} {'CPU µs / 1,000 tokens':>22}")
    for name in PARSERS:
        for kind in ("calls", "prose"):
            pieces = answer(name, kind)
            check = PARSERS[name](SCHEMAS)
            for piece in pieces:
                check.feed(piece)
            check.finish()
            micros = cpu_per_1000(name, pieces, args.repeat) * 1e6
            print(f"{name:<12} {kind:<6} {len(pieces):>6} {check.calls:>5} {micros:>22,.0f}")


if __name__ == "__main__":
    main()
