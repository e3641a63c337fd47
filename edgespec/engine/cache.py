"""KVSequence: one sequence of a context's KV cache and the tokens it holds, always in step.

Every change to the cache goes through here: `extend` (llama_decode) and
`truncate` (llama_memory_seq_rm). `sync` is prefix reuse: keep the longest
common prefix with the wanted tokens and evaluate only the rest, which is how
a chat turn, a regenerated reply and the draft model's catch-up all work.
A sequence that shares its context with others (engine/slots.py) asks them to
make room before a decode, and before a read looks for a snapshot that holds
more of the wanted tokens than it does.
"""

from __future__ import annotations

from typing import Iterator, Protocol, Sequence

import numpy as np

from edgespec.errors import ContextFullError
from edgespec.llama.batch import LlamaBatch
from edgespec.llama.context import LlamaContext


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if list(a[:n]) == list(b[:n]):  # the usual case in a decode loop, compared in C
        return n
    return next(i for i in range(n) if a[i] != b[i])


RECALL_MIN = 32
"""Fewer unread tokens than this are read, not looked for in snapshots: a draft
model's catch-up each cycle is one or two tokens, and a snapshot is worth
restoring only when it spares a real read."""


class Neighbours(Protocol):
    """The other sequences of a context (engine/slots.py's SequencePool)."""

    def make_room(self, n: int, seq: "KVSequence") -> bool:
        """Free cells for n more tokens of `seq` (others' go to snapshots); False if none could be freed."""

    def recall(self, seq: "KVSequence", tokens: Sequence[int], held: int) -> str | None:
        """Before `seq` reads `tokens` (sharing `held` with it): keep what it gives up
        to another conversation, and restore a snapshot that holds more of them (when
        that spares a real read: RECALL_MIN); where it came from."""


class KVSequence:
    """One sequence of a LlamaContext, with the list of tokens its cache holds."""

    def __init__(self, ctx: LlamaContext, seq_id: int = 0, *, pool: Neighbours | None = None):
        self.ctx = ctx
        self.seq_id = seq_id
        self.pool = pool
        self.tokens: list[int] = []
        self.n_ctx = ctx.n_ctx()
        self.evaluated = 0
        """Tokens decoded over this sequence's lifetime (a counter for stats and tests)."""
        self._batch = LlamaBatch(ctx.n_batch)
        self._logits_at = -1  # position whose logits the last decode left as its last output

    @property
    def room(self) -> int:
        """Positions still free in the context."""
        return self.n_ctx - len(self.tokens)

    def truncate(self, n: int) -> None:
        """Keep the first n tokens; remove the rest from the KV cache."""
        if n < len(self.tokens):
            self.ctx.memory_seq_rm(self.seq_id, n)
            del self.tokens[n:]
            if self._logits_at >= n:
                self._logits_at = -1

    def extend(self, tokens: Sequence[int], *, all_logits: bool = False) -> None:
        """Evaluate tokens after those held, in batches of n_batch. With all_logits
        (at most one batch), every token gets logits: `logits(i)` reads them."""
        if not tokens:
            return
        if len(tokens) > self.room:
            raise ContextFullError(
                f"{len(tokens)} more tokens do not fit: {len(self.tokens)} of {self.n_ctx} context positions are in use"
            )
        if all_logits and len(tokens) > self._batch.capacity:
            raise ValueError(f"logits for {len(tokens)} tokens need one batch (n_batch is {self._batch.capacity})")
        try:
            for i in range(0, len(tokens), self._batch.capacity):
                chunk = tokens[i : i + self._batch.capacity]
                self._batch.set(chunk, len(self.tokens), all_logits=all_logits, seq_id=self.seq_id)
                self._decode(len(chunk))
                self.tokens.extend(chunk)
                self.evaluated += len(chunk)
        except BaseException:
            # A failed or interrupted decode may leave part of a batch in the cache.
            self.ctx.memory_seq_rm(self.seq_id, len(self.tokens))
            self._logits_at = -1
            raise
        self._logits_at = len(self.tokens) - 1

    def _decode(self, n: int) -> None:
        """Decode the batch of n tokens; with neighbours, free their cells first
        (and again if llama.cpp still finds no room, until none is left to free)."""
        if self.pool is None:
            self.ctx.decode(self._batch)
            return
        self.pool.make_room(n, self)
        while True:
            try:
                self.ctx.decode(self._batch)
                return
            except ContextFullError:
                if not self.pool.make_room(self.n_ctx, self):
                    raise

    def recall(self, tokens: Sequence[int], held: int | None = None) -> str | None:
        """Before reading `tokens`: if a snapshot holds more of them than this
        sequence does, restore it ("ram" or "disk": where it came from). `held`:
        their common prefix with what the sequence holds, if known."""
        if self.pool is None:
            return None
        held = common_prefix_length(self.tokens, tokens) if held is None else held
        return self.pool.recall(self, tokens, held)

    def restored(self, tokens: Sequence[int]) -> None:
        """The cache now holds `tokens` (a snapshot was loaded into it)."""
        self.tokens = list(tokens)
        self._logits_at = -1

    def logits(self, i: int) -> np.ndarray:
        """Logits of the i-th output of the last extend (a view, valid until the next decode)."""
        return self.ctx.get_logits_ith(i)

    def sync(self, tokens: Sequence[int]) -> int:
        """Make the cache hold exactly `tokens`, reusing the common prefix.
        Returns how many tokens were evaluated."""
        before = self.evaluated
        for _ in self.sync_steps(tokens):
            pass
        return self.evaluated - before

    def sync_steps(self, tokens: Sequence[int]) -> Iterator[int]:
        """`sync`, one batch at a time, yielding after each how many of `tokens`
        the cache holds: reading a long prompt can be stopped between batches
        (the cache then holds a prefix of it, which the next sync reuses)."""
        held = common_prefix_length(self.tokens, tokens)
        if self.recall(tokens, held):
            held = common_prefix_length(self.tokens, tokens)
        self.truncate(held)
        step = self._batch.capacity
        while len(self.tokens) < len(tokens):
            self.extend(tokens[len(self.tokens) : len(self.tokens) + step])
            yield len(self.tokens)

    def next_logits(self, tokens: Sequence[int]) -> np.ndarray:
        """Sync to `tokens` and return the logits that predict the token after them."""
        if not tokens:
            raise ValueError("need at least one token to predict from")
        self.sync(tokens)
        if self._logits_at != len(self.tokens) - 1:  # all cached, logits gone: redo the last
            self.truncate(len(tokens) - 1)
            self.extend(tokens[-1:])
        return self.logits(-1)

    def reset(self) -> None:
        """Empty this sequence (the next sync evaluates everything)."""
        self.ctx.memory_seq_rm(self.seq_id, 0)
        self.tokens.clear()
        self._logits_at = -1

    def close(self) -> None:
        self._batch.close()
