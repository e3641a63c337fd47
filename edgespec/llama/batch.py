"""LlamaBatch: owns one llama_batch (llama_batch_init ... llama_batch_free)."""

from __future__ import annotations

from typing import Sequence

import llama_cpp


class LlamaBatch:
    """A reusable batch of up to `capacity` tokens of one sequence."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._batch = llama_cpp.llama_batch_init(capacity, 0, 1)

    @property
    def struct(self) -> llama_cpp.llama_batch:
        return self._batch

    def set(self, tokens: Sequence[int], start_pos: int, *, all_logits: bool, seq_id: int = 0) -> None:
        """Fill with `tokens` of sequence `seq_id` at positions start_pos...; logits for
        every token, or the last only."""
        n = len(tokens)
        if not 0 < n <= self.capacity:
            raise ValueError(f"batch holds 1..{self.capacity} tokens, got {n}")
        b = self._batch
        b.n_tokens = n
        for i, token in enumerate(tokens):
            b.token[i] = token
            b.pos[i] = start_pos + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq_id
            b.logits[i] = all_logits
        b.logits[n - 1] = True

    def close(self) -> None:
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None

    def __enter__(self) -> "LlamaBatch":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
