"""What reading the sampled ids costs: CPU seconds per 1,000 sampled tokens for each reasoning
format in the registry (``think``: incremental decode, ``<think>``, hermes calls; ``harmony``,
HARMONY-6) and for ``plain`` (the decoder and the hermes parser alone).

    python -m bench.reader_cpu [--tokens 200000] [--chunk 3] [--tokenizer PATH]

Each format's own sample answer (``ReasoningParser.sample``: reasoning, a message, a tool call)
is read as one generation by a fresh reader, built the way a route builds it, fed in chunks of
``--chunk`` ids as a server streams them, again and again until ``--tokens`` ids were read;
the figure is process CPU time over the feeds and finishes, per 1,000 ids. Text formats run
``--tokenizer`` (a ``tokenizer.json``) under a small ChatML template, or without it a
byte-level BPE trained here on the samples (2,000 tokens); harmony always runs gpt-oss's o200k
encoding.
"""

from __future__ import annotations

import argparse
import functools
import json
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from engine.models.tokens.reasoning import (
    REASONING_PARSERS,
    AnswerReader,
    PlainText,
    ReasoningParser,
)
from engine.models.tokens.render import RENDERERS, Renderer
from engine.models.tokens.tokenizer import ChatTemplate, ModelTokenizer

REASONING = (
    "The user asks for the weather in Paris. I should call get_weather with the city, then "
    "answer in one sentence; the tool returns a short string, so no further calls are needed. "
)
ARGUMENTS = '{"city": "Paris", "unit": "celsius"}'
ANSWER = "It is sunny in Paris today, 21 degrees, with a light wind from the west."
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
FORMATS: dict[str, type[ReasoningParser]] = {
    "plain": PlainText,
    **{name: REASONING_PARSERS[name] for name in REASONING_PARSERS},
}


def sample(kind: type[ReasoningParser]) -> str:
    return kind.sample(REASONING * 4, ANSWER, "get_weather", ARGUMENTS)


def _trained_tokenizer(directory: Path) -> Path:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2000,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = [sample(k) for k in FORMATS.values() if k.template == "jinja"]
    tokenizer.train_from_iterator(texts * 8, trainer)
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


def run(tokens: int, chunk: int, tokenizer_file: Path | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as scratch:
        path = tokenizer_file or _trained_tokenizer(Path(scratch))
        model = ModelTokenizer(Tokenizer.from_file(str(path)), ChatTemplate(CHATML))
    renderers: dict[str, Renderer[Any]] = {}
    figures: dict[str, Any] = {}
    for name, kind in FORMATS.items():
        if kind.template not in renderers:
            renderers[kind.template] = RENDERERS[kind.template].build(model, False)
        renderer = renderers[kind.template]
        fmt = kind(renderer, "hermes", Counter())
        text = sample(kind)
        ids = renderer.encode(text)
        figures[f"{name}_answer_ids"] = len(ids)
        cpu = measure(functools.partial(fmt.reader, {}), ids, tokens, chunk)
        figures[f"{name}_cpu_ms_per_1000"] = round(cpu * 1000, 3)
    return figures


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
