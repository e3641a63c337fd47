"""Tiny llama-architecture GGUF models with random weights, written with the
`gguf` package: real llama.cpp models that load in milliseconds.

Models written with the same vocabulary are a valid target/draft pair; a
different `seed` gives a draft that often disagrees, `noise` a draft that
mostly agrees with the model of `base_seed`.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

SPECIALS = ["<unk>", "<s>", "</s>"]
BYTES = [f"<0x{b:02X}>" for b in range(256)]  # byte fallback: any text can be tokenized
FIRST_WORD = len(SPECIALS) + len(BYTES)
FIM = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"]
"""Fill-in-the-middle control tokens (prefix, suffix, middle), Qwen2.5-Coder's texts."""


def vocabulary(n_words: int, *, byte_tokens: bool = True) -> list[str]:
    """Specials, the 256 byte tokens (optional), then words "▁w0", "▁w1", ..."""
    return SPECIALS + (BYTES if byte_tokens else []) + [f"\u2581w{i}" for i in range(n_words)]


def write_model(
    path: Path,
    *,
    seed: int = 0,
    n_words: int = 58,
    n_embd: int = 64,
    n_layer: int = 2,
    n_head: int = 2,
    n_head_kv: int = 1,
    n_ff: int = 128,
    n_ctx_train: int = 512,
    logit_scale: float = 1.0,
    base_seed: int | None = None,
    noise: float = 0.0,
    byte_tokens: bool = True,
    fim: bool = False,
) -> Path:
    """Write a random model; with base_seed, the weights of that model plus `noise`.
    Without byte tokens the vocabulary is tiny, but only token ids can be fed. With
    `fim`, the FIM tokens follow the words, named in the GGUF's metadata."""
    fims = FIM if fim else []
    tokens = vocabulary(n_words, byte_tokens=byte_tokens) + fims
    n_vocab = len(tokens)
    n_quiet = len(SPECIALS) + (len(BYTES) if byte_tokens else 0)
    weights = _weights(base_seed if base_seed is not None else seed, n_vocab, n_embd, n_layer,
                       n_head, n_head_kv, n_ff, logit_scale, n_quiet)
    if base_seed is not None and noise:
        rng = np.random.default_rng(seed)
        weights = {k: (v + noise * v.std() * rng.standard_normal(v.shape).astype(np.float32)
                       if v.ndim == 2 else v) for k, v in weights.items()}

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(f"synthetic-{seed}")
    w.add_context_length(n_ctx_train)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * n_vocab)
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * (len(BYTES) if byte_tokens else 0)
    types += [gguf.TokenType.NORMAL] * n_words + [gguf.TokenType.CONTROL] * len(fims)
    w.add_token_types(types)
    fim_keys = (gguf.Keys.Tokenizer.FIM_PRE_ID, gguf.Keys.Tokenizer.FIM_SUF_ID, gguf.Keys.Tokenizer.FIM_MID_ID)
    for key, text in zip(fim_keys, fims):
        w.add_uint32(key, tokens.index(text))
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    for name, tensor in weights.items():
        w.add_tensor(name, tensor)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _weights(seed, n_vocab, n_embd, n_layer, n_head, n_head_kv, n_ff, logit_scale, n_quiet):
    rng = np.random.default_rng(seed)

    def mat(rows, cols, scale=1.0):
        return (rng.standard_normal((rows, cols)) * scale / np.sqrt(cols)).astype(np.float32)

    n_kv = n_embd // n_head * n_head_kv
    out = {
        "token_embd.weight": mat(n_vocab, n_embd, np.sqrt(n_embd)),
        "output_norm.weight": np.ones(n_embd, dtype=np.float32),
        "output.weight": mat(n_vocab, n_embd, 4.0 * logit_scale),
    }
    out["output.weight"][:n_quiet] *= 0.1  # specials and bytes: rarely generated, so runs are long
    for i in range(n_layer):
        out.update({
            f"blk.{i}.attn_norm.weight": np.ones(n_embd, dtype=np.float32),
            f"blk.{i}.attn_q.weight": mat(n_embd, n_embd),
            f"blk.{i}.attn_k.weight": mat(n_kv, n_embd),
            f"blk.{i}.attn_v.weight": mat(n_kv, n_embd),
            f"blk.{i}.attn_output.weight": mat(n_embd, n_embd),
            f"blk.{i}.ffn_norm.weight": np.ones(n_embd, dtype=np.float32),
            f"blk.{i}.ffn_gate.weight": mat(n_ff, n_embd),
            f"blk.{i}.ffn_up.weight": mat(n_ff, n_embd),
            f"blk.{i}.ffn_down.weight": mat(n_embd, n_ff),
        })
    return out
