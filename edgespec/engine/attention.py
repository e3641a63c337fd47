"""How attention runs where every layer is on the CPU: flash attention or not, and
so how many conversations a context can hold at no cost."""

from __future__ import annotations


CPU_SCORES_MAX_BYTES = 512 << 20
"""Flash attention for a model whose layers all run on the CPU: off, while the
attention scores of one batch over the whole context (what the unfused path
holds, n_ctx x n_batch x n_head floats) take at most this much memory; beyond,
llama.cpp's choice (on), which holds none of them. ggml's CPU kernel for flash
attention reads the whole KV cache once per token of a batch, where the unfused
path multiplies the batch against the cache in one matrix product: deep in a
conversation, verify passes and prompt reading cost much less without it.
scripts/bench_flash_attn.py measures both on any machine (its docstring keeps
the figures behind this rule)."""


def cpu_flash_attn(n_ctx: int, n_batch: int, n_head: int) -> bool | None:
    """Flash attention for a model all on the CPU (None: llama.cpp's choice); see CPU_SCORES_MAX_BYTES."""
    return False if n_ctx * n_batch * n_head * 4 <= CPU_SCORES_MAX_BYTES else None


SLOTS = 4
"""Conversations held in a context at once where that costs nothing (llama-server's default)."""


def default_slots(flash_attn: bool | None) -> int:
    """SLOTS where the target runs with flash attention (None: llama.cpp's choice,
    on wherever the backend has it), whose kernels skip the cells of other
    sequences; 1 where it runs without: the unfused path multiplies every pass
    against every cell of the unified cache, other conversations' included, so a
    prompt read beside another conversation reads slower. There, other
    conversations wait in RAM snapshots, restored in tens of milliseconds."""
    return 1 if flash_attn is False else SLOTS
