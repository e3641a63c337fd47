"""A one-layer GGUF model with a given attention shape and almost nothing else.

Flash attention on or off changes only how attention runs, and attention costs
every layer of a model the same; so one layer with the model's heads, head
sizes and context shows in seconds which setting costs the whole model less
(engine/attention.py measures it). Its embeddings and feed-forward are tiny:
their cost, the same either way, does not hide the difference."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from edgespec.llama.model import AttentionShape  # a loaded model's (LlamaModel.attention_shape)

N_EMBD = 64
"""The probe's model width: attention's heads are the model's, projected from and to this."""
N_VOCAB = 32


def write_attention_model(path: Path, shape: AttentionShape) -> Path:
    """Write a llama-architecture GGUF with one layer of `shape`'s attention and random weights."""
    import gguf  # only here: most runs find the measurement it serves kept on disk

    logging.getLogger("gguf").setLevel(logging.WARNING)  # it tells of every file it writes
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("edgespec-attention-probe")
    w.add_context_length(1 << 20)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(1)
    w.add_feed_forward_length(N_EMBD)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    w.add_key_length(shape.head_k)
    w.add_value_length(shape.head_v)
    w.add_rope_dimension_count(shape.head_k)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(N_VOCAB)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_token_list(["<unk>", "<s>", "</s>"] + [f"\u2581w{i}" for i in range(N_VOCAB - 3)])
    w.add_token_scores([0.0] * N_VOCAB)
    w.add_token_types([gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
                      + [gguf.TokenType.NORMAL] * (N_VOCAB - 3))
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    rng = np.random.default_rng(0)

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    ones = np.ones(N_EMBD, dtype=np.float32)
    q, k, v = shape.n_head * shape.head_k, shape.n_head_kv * shape.head_k, shape.n_head_kv * shape.head_v
    tensors = {
        "token_embd.weight": mat(N_VOCAB, N_EMBD), "output_norm.weight": ones, "output.weight": mat(N_VOCAB, N_EMBD),
        "blk.0.attn_norm.weight": ones, "blk.0.attn_q.weight": mat(q, N_EMBD), "blk.0.attn_k.weight": mat(k, N_EMBD),
        "blk.0.attn_v.weight": mat(v, N_EMBD), "blk.0.attn_output.weight": mat(N_EMBD, shape.n_head * shape.head_v),
        "blk.0.ffn_norm.weight": ones, "blk.0.ffn_gate.weight": mat(N_EMBD, N_EMBD),
        "blk.0.ffn_up.weight": mat(N_EMBD, N_EMBD), "blk.0.ffn_down.weight": mat(N_EMBD, N_EMBD),
    }
    for name, tensor in tensors.items():
        w.add_tensor(name, tensor)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
