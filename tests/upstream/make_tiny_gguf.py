"""Write a tiny random-weight llama GGUF (byte-fallback SPM vocabulary) for ``test-real``.

Run with the interpreter that has ``gguf`` installed (the llama.cpp venv), not imported by the
test suite: ``python make_tiny_gguf.py OUT.gguf``. Nothing is downloaded; the weights are random,
so the model babbles, but llama.cpp's grammar-constrained tool calls still produce valid JSON.
"""

from __future__ import annotations

import sys

import gguf  # type: ignore[import-not-found, unused-ignore]
import numpy as np

N_EMBD, N_HEAD, N_FF, N_LAYER, N_CTX = 64, 4, 128, 2, 2048
WORDS = ["▁the", "▁a", "▁is", "▁weather", "▁sunny", "▁Paris", "▁hello", "{", "}", '"', ":", "▁"]


def vocabulary(size: int = 0) -> tuple[list[str], list[float], list[int]]:
    """<unk>, <s>, </s>, the 256 byte tokens (so any text encodes), a few words, padded with
    filler words up to ``size`` ids: the token-in test (TOK-2) samples ids that its own
    tokenizer decodes, so only the vocabulary's size and end id (2) have to agree."""
    words = [*WORDS, *(f"▁w{n}" for n in range(max(size - 259 - len(WORDS), 0)))]
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *words]
    types = [2, 3, 3] + [6] * 256 + [1] * len(words)  # unknown, control, byte, normal
    scores = [0.0] * 259 + [-float(i) for i in range(len(words))]
    return tokens, scores, types


def write(path: str, size: int = 0) -> None:
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name("tiny-random")
    writer.add_context_length(N_CTX)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    tokens, scores, types = vocabulary(size)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    _tensors(writer, len(tokens))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _tensors(writer: gguf.GGUFWriter, n_vocab: int) -> None:
    rng = np.random.default_rng(0)

    def random(name: str, *shape: int) -> None:
        writer.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))

    def ones(name: str) -> None:
        writer.add_tensor(name, np.ones(N_EMBD, dtype=np.float32))

    random("token_embd.weight", n_vocab, N_EMBD)
    ones("output_norm.weight")
    random("output.weight", n_vocab, N_EMBD)
    for i in range(N_LAYER):
        ones(f"blk.{i}.attn_norm.weight")
        ones(f"blk.{i}.ffn_norm.weight")
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            random(f"blk.{i}.{name}.weight", N_EMBD, N_EMBD)
        random(f"blk.{i}.ffn_gate.weight", N_FF, N_EMBD)
        random(f"blk.{i}.ffn_up.weight", N_FF, N_EMBD)
        random(f"blk.{i}.ffn_down.weight", N_EMBD, N_FF)


if __name__ == "__main__":
    write(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0)
