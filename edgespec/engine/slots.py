"""Several conversations in one model's KV cache, and their snapshots.

A context holds n sequences in one unified cache (every sequence may use all
n_ctx cells; together they hold at most n_ctx). This module decides which
sequence a prompt goes to, which is freed when a decode needs cells (the least
recently used), and what is kept of a sequence before its cells are freed: a
snapshot (engine/snapshots.py), restored instead of read when a prompt comes
back to it. So switching between conversations reads only their new tokens.
"""

from __future__ import annotations

import logging
from typing import Sequence

import numpy as np

from edgespec.engine.cache import RECALL_MIN, KVSequence, common_prefix_length
from edgespec.engine.snapshots import Snapshot, SnapshotCache, prefix_length
from edgespec.llama.context import LlamaContext

log = logging.getLogger("edgespec.cache")

SLOTS = 4
"""Conversations held in a context at once where the attention kernels skip the cells of
other sequences (llama-server's default)."""


def default_slots(flash_attn: bool | None, *, on_cpu: bool) -> int:
    """SLOTS where the target runs on a GPU with flash attention (None: llama.cpp's choice,
    on wherever the backend has it); 1 where it runs without (the unfused path multiplies
    every pass against every cell of the unified cache, other conversations' included) and
    wherever it runs on the CPU: there the flash-attention kernel too goes over every cell,
    and three other conversations of 1,500 tokens beside one of 1,500 made each token 16%
    slower (docs/design.md). Other conversations then wait in RAM snapshots, restored in
    milliseconds."""
    return 1 if on_cpu or flash_attn is False else SLOTS


SNAPSHOT_MIN = 64
"""Tokens a sequence must hold, beyond what the next use keeps, to be snapshot
before its cells are freed: reading fewer costs less than keeping them."""

KEEP_SHARE = 0.5
"""A prompt goes to a sequence that shares at least this share of what it holds
(the same conversation, moved on or edited near its end); otherwise to an empty
one, or the least recently used. Either way nothing is lost: what a sequence
gives up is snapshot first."""


class SequencePool:
    """The sequences of one context, least recently used first in `order`."""

    def __init__(self, ctx: LlamaContext, *, key: str, cache: SnapshotCache | None = None):
        self.ctx = ctx
        self.key = key
        """Which model and cache settings the snapshots of these sequences are for."""
        self.cache = cache
        self.seqs = [KVSequence(ctx, i, pool=self) for i in range(ctx.n_seq_max)]
        self.order = list(self.seqs)
        self.current = self.seqs[0]
        """The sequence in use (the one a reply decodes in)."""

    @property
    def used(self) -> int:
        """Cells in use, by every sequence."""
        return sum(len(s.tokens) for s in self.seqs)

    # -- choosing ---------------------------------------------------------------------
    def choose(self, prompt: Sequence[int]) -> int:
        """The sequence for `prompt`, which becomes the current one: the one that
        shares most of it, if that keeps at least KEEP_SHARE of what it holds;
        else an empty one; else the least recently used."""
        def shared(s: KVSequence) -> int:
            return common_prefix_length(s.tokens, prompt)

        held = [s for s in self.seqs if s.tokens]
        best = max(held, key=shared, default=None)
        if best is not None and shared(best) >= KEEP_SHARE * len(best.tokens):
            seq = best
        else:
            seq = next((s for s in self.order if not s.tokens), self.order[0])
        self.use(seq.seq_id)
        return seq.seq_id

    def use(self, seq_id: int) -> KVSequence:
        """Make sequence `seq_id` the current one (the most recently used)."""
        seq = self.seqs[seq_id]
        self.order.remove(seq)
        self.order.append(seq)
        self.current = seq
        return seq

    # -- room -------------------------------------------------------------------------
    def make_room(self, n: int, seq: KVSequence) -> bool:
        """Free cells until n more fit beside what is held, evicting the least
        recently used other sequences; False when there was nothing to evict."""
        freed = False
        for other in list(self.order):
            if self.used + n <= seq.n_ctx:  # the usual case, every decode: nothing to do
                break
            if other is not seq and other.tokens:
                self.evict(other)
                freed = True
        return freed

    def evict(self, seq: KVSequence) -> None:
        """Free a sequence's cells, keeping a snapshot of them if worth it."""
        self.keep(seq)
        seq.reset()

    def keep(self, seq: KVSequence, *, beyond: int = 0) -> None:
        """Snapshot what `seq` holds into the cache, if it holds SNAPSHOT_MIN tokens
        more than the `beyond` its next use keeps."""
        if self.cache is None or self.cache.ram_bytes == 0 or len(seq.tokens) - beyond < SNAPSHOT_MIN:
            return
        self.cache.keep(self._snapshot(seq))

    def _snapshot(self, seq: KVSequence) -> Snapshot:
        data = self.ctx.state_seq_get_data(seq.seq_id)
        return Snapshot(self.key, np.asarray(seq.tokens, dtype=np.int32), data)

    # -- snapshots --------------------------------------------------------------------
    def recall(self, seq: KVSequence, tokens: Sequence[int], held: int) -> str | None:
        """Before `seq` reads `tokens`, of which it holds the first `held`: keep what it
        would give up (on a short read, only to another conversation: not a reply
        asked again), and restore the snapshot that shares at least RECALL_MIN more
        of `tokens` than it does, if any. Returns "ram" or "disk" when one was restored."""
        short = len(tokens) - held < RECALL_MIN  # fewer new tokens than a snapshot is worth looking for
        if not short or held < KEEP_SHARE * len(seq.tokens):
            self.keep(seq, beyond=held)
        if short or self.cache is None:
            return None
        # one that spares a real read and fits this context
        found = self.cache.find(self.key, tokens, more_than=held + RECALL_MIN - 1, room=seq.n_ctx)
        if found is None:
            return None
        snap = found.snapshot
        seq.reset()
        self.make_room(snap.tokens.size, seq)
        if not self.ctx.state_seq_set_data(seq.seq_id, snap.data):
            # the other sequences made room for it: it is not a cache of this model and settings
            log.warning("llama.cpp refused a KV snapshot of %d tokens (made with other cache settings, "
                        "or damaged); it is deleted and they are read", snap.tokens.size)
            self.cache.drop(snap)
            seq.reset()
            return None
        seq.restored(snap.tokens.tolist())
        return found.source

    def save(self) -> None:
        """Write every sequence and RAM snapshot to the disk cache (when there is
        one): the conversations held now are there for the next run."""
        if self.cache is None or self.cache.disk is None:
            return
        snaps = [self._snapshot(s) for s in self.seqs if len(s.tokens) >= SNAPSHOT_MIN]
        snaps += [s for s in self.cache.snapshots() if s.key == self.key]
        for snap in snaps:
            # one that another extends is not written: the longer one serves both
            if not any(o is not snap and o.tokens.size > snap.tokens.size
                       and prefix_length(o.tokens, snap.tokens) == snap.tokens.size for o in snaps):
                self.cache.save(snap)

    def reset(self) -> None:
        """Empty every sequence."""
        for seq in self.seqs:
            seq.reset()

    def close(self) -> None:
        for seq in self.seqs:
            seq.close()
