"""TOK-11: the tiktoken-run encoder of a byte-level BPE tokenizer gives exactly the ids of
``tokenizers`` on any text (special tokens inside it included), or is not used."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from clients.bench.services.tiny_model import SPECIALS, make_tokenizer
from clients.bench.suites.codex import TOOL_NAMES, generated_output, instructions
from engine.models.tokens.fast_bpe import fast_encoder
from engine.models.tokens.tokenizer import load_tokenizer


@pytest.fixture(scope="module", params=["tiny", "codex"])
def tokenizer_file(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    root = tmp_path_factory.mktemp(request.param)
    if request.param == "tiny":
        return make_tokenizer(root) / "tokenizer.json"
    corpus = [instructions(), *(generated_output(n, i, 4000) for i, n in enumerate(TOOL_NAMES))]
    return make_tokenizer(root, corpus=corpus, vocab_size=8000) / "tokenizer.json"


pieces = st.one_of(
    st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=30),
    st.sampled_from([*SPECIALS, " ", "\n\n", "  \t", "'s", "'ll", "123", "fn x()", "Zürich"]),
    # whitespace runs before a non-space, where the split's lookaround acts (and is cut for)
    st.sampled_from(
        ["   x", "\n    def", " \nx", "\t\t'", "\xa0\xa0x", "\u2003 7", "\x85 .", "  's"]
    ),
    st.sampled_from(["\x1c\x1cx", "\x1f \x1c", "\u200b\u200b ", "\r\n  }", "\u3000\u3000é"]),
)
texts = st.lists(pieces, max_size=12).map("".join)


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=texts)
def test_fast_encoder_matches_tokenizers(tokenizer_file: Path, text: str) -> None:
    fast = fast_encoder(tokenizer_file, ["probe"])
    assert fast is not None
    reference = Tokenizer.from_file(str(tokenizer_file))
    assert fast(text) == reference.encode(text, add_special_tokens=False).ids


def test_a_shape_it_cannot_run_keeps_tokenizers(tmp_path: Path) -> None:
    """A tokenizer with a normalizer tiktoken has no equivalent for stays on ``tokenizers``."""
    source = make_tokenizer(tmp_path / "src") / "tokenizer.json"
    spec = json.loads(source.read_text())
    spec["normalizer"] = {"type": "Lowercase"}
    (tmp_path / "odd").mkdir()
    odd = tmp_path / "odd" / "tokenizer.json"
    odd.write_text(json.dumps(spec))
    (tmp_path / "odd" / "tokenizer_config.json").write_text(
        (tmp_path / "src" / "tokenizer_config.json").read_text()
    )
    assert fast_encoder(odd, ["probe"]) is None
    assert load_tokenizer(str(tmp_path / "odd")).fast is None
    assert load_tokenizer(str(tmp_path / "src")).fast is not None
