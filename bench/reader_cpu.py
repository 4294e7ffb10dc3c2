"""What reading the sampled ids costs: CPU seconds per 1,000 sampled tokens for the ``think``
reader (incremental decode, ``<think>``, hermes calls) and the harmony reader (HARMONY-6).

    python -m bench.reader_cpu [--tokens 200000] [--chunk 3] [--tokenizer PATH]

Each format's answer (reasoning, a message, a tool call) is read as one generation by a fresh
reader, fed in chunks of ``--chunk`` ids as a server streams them, again and again until
``--tokens`` ids were read; the figure is process CPU time over the feeds and finishes, per
1,000 ids. Without ``--tokenizer`` the
think reader runs a byte-level BPE trained here on the sample (2,000 tokens); harmony always
runs gpt-oss's o200k encoding.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from engine.models.tokens.harmony import HarmonyReader, harmony_encoding
from engine.models.tokens.reasoning import AnswerReader, TextReader, ThinkParser
from engine.models.tokens.tokenizer import IncrementalDecoder
from engine.models.tokens.tool_parsers import HermesParser

REASONING = (
    "The user asks for the weather in Paris. I should call get_weather with the city, then "
    "answer in one sentence; the tool returns a short string, so no further calls are needed. "
)
CALL = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
ANSWER = "It is sunny in Paris today, 21 degrees, with a light wind from the west."
THINK = f"<think>\n{REASONING * 4}\n</think>\n\n{ANSWER}\n<tool_call>\n{CALL}\n</tool_call>"
HARMONY = (
    f"<|channel|>analysis<|message|>{REASONING * 4}<|end|>"
    f"<|start|>assistant<|channel|>commentary<|message|>{ANSWER}<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "Paris", "unit": "celsius"}<|call|>'
)


def _trained_tokenizer(directory: Path) -> Path:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2000,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([THINK] * 8, trainer)
    path = directory / "tokenizer.json"
    tokenizer.save(str(path))
    return path


def measure(make: Callable[[], AnswerReader], answer: list[int], tokens: int, chunk: int) -> float:
    """CPU seconds per 1,000 ids: generations of ``answer``, each read by a fresh reader fed in
    chunks of ``chunk`` ids, until ``tokens`` ids were read."""
    rounds = max(1, tokens // len(answer))
    started = time.process_time()
    for _ in range(rounds):
        reader = make()
        for at in range(0, len(answer), chunk):
            reader.feed(answer[at : at + chunk])
        reader.finish()
    return (time.process_time() - started) / (rounds * len(answer)) * 1000


def run(tokens: int, chunk: int, tokenizer_file: Path | None) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as scratch:
        path = tokenizer_file or _trained_tokenizer(Path(scratch))
        tokenizer = Tokenizer.from_file(str(path))
    think_ids: list[int] = tokenizer.encode(THINK, add_special_tokens=False).ids
    encoding = harmony_encoding()
    harmony_ids = encoding.encode(HARMONY, allowed_special="all")

    def think() -> AnswerReader:
        parser = ThinkParser(HermesParser(), False, Counter())
        return TextReader(IncrementalDecoder(tokenizer, frozenset()), parser)

    def hermes() -> AnswerReader:
        return TextReader(IncrementalDecoder(tokenizer, frozenset()), HermesParser())

    def harmony() -> AnswerReader:
        return HarmonyReader(encoding, Counter())

    figures = {
        "think": measure(think, think_ids, tokens, chunk),
        "hermes_only": measure(hermes, think_ids, tokens, chunk),
        "harmony": measure(harmony, harmony_ids, tokens, chunk),
    }
    return {
        "think_answer_ids": len(think_ids),
        "harmony_answer_ids": len(harmony_ids),
        **{f"{name}_cpu_ms_per_1000": round(value * 1000, 3) for name, value in figures.items()},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--tokens", type=int, default=200_000)
    parser.add_argument("--chunk", type=int, default=3)
    parser.add_argument("--tokenizer", type=Path, default=None)
    args = parser.parse_args(argv)
    figures = run(args.tokens, args.chunk, args.tokenizer)
    print(json.dumps({"tokens": args.tokens, "chunk": args.chunk, **figures}))


if __name__ == "__main__":
    main()
