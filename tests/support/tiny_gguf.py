"""A tiny random-weight llama GGUF whose vocabulary *is* a tokenizer the test trained (TOK-40).

The tokenizer (``clients.bench.services.tiny_model.make_tokenizer``: byte-level BPE, ChatML
specials) is written into the GGUF as llama.cpp's ``gpt2`` tokenizer: the same tokens in the same
id order, the same merges, the gpt2 pre-tokenizer regex (what ``ByteLevel(use_regex=True)`` splits
by), the specials as control tokens, ``<|im_end|>`` as end of turn, and its chat template. So
``llama-server`` and the engine tokenize and detokenize alike: the ids one samples are the ids
the other reads. Nothing is downloaded; the weights are random, so the model babbles.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np

N_EMBD, N_HEAD, N_FF, N_LAYER, N_CTX = 64, 4, 128, 2, 4096
_NORMAL, _CONTROL = 1, 3  # gguf.TokenType values


def vocabulary(tokenizer_dir: Path) -> tuple[list[str], list[int], list[str], dict[str, int]]:
    """Tokens by id, their types, the merges (``"a b"``) and the special tokens' ids."""
    spec = json.loads((tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))
    by_id = {token_id: token for token, token_id in spec["model"]["vocab"].items()}
    specials = {added["content"]: added["id"] for added in spec["added_tokens"]}
    by_id.update({token_id: token for token, token_id in specials.items()})
    assert sorted(by_id) == list(range(len(by_id))), "the ids must be contiguous"
    tokens = [by_id[n] for n in range(len(by_id))]
    special_ids = set(specials.values())
    types = [_CONTROL if n in special_ids else _NORMAL for n in range(len(tokens))]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    return tokens, types, merges, specials


def write(path: Path, tokenizer_dir: Path) -> Path:
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    tokens, types, merges, specials = vocabulary(tokenizer_dir)
    writer = gguf.GGUFWriter(str(path), "llama")
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
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(specials["<|endoftext|>"])
    writer.add_eos_token_id(specials[config["eos_token"]])
    writer.add_eot_token_id(specials[config["eos_token"]])
    writer.add_add_bos_token(False)
    writer.add_chat_template(config["chat_template"])
    _tensors(writer, len(tokens))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


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
