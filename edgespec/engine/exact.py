"""Which verify batches are exact: one pass over n tokens must give, token for
token, the very logits that n single-token passes give, or greedy speculation
could flip a near-tie that plain decoding would not.

llama.cpp picks kernels by batch size (and on the CPU splits single-token
attention across threads), so this is measured, not assumed: once per engine,
on its own target context, with the cache left as it was.
"""

from __future__ import annotations

import time

import numpy as np

from edgespec.engine.cache import KVSequence

PROBE_LIMIT = 8
"""Largest batch the probe tries: 1 + the longest draft worth checking for exactness."""

TOLERANCE = 1e-3
"""Largest logit difference accepted as exact. Quantized CPU models measure 0
(bit-identical); float weights go through BLAS-like kernels for batches and
differ by ~1e-6, which could only flip two tokens tied to within that; a batch
kernel that quantizes activations differently is off by ~0.4 and is refused."""


def largest_exact_batch(seq: KVSequence, limit: int = PROBE_LIMIT,
                        tolerance: float = TOLERANCE) -> tuple[int, dict[int, float]]:
    """The largest n <= limit such that every batch of 2..n tokens gives the logits
    of single-token passes (to within `tolerance`), and the pass times seen on
    the way (by batch size). Every size is measured: kernels switch at several
    sizes, so a batch of 8 being exact says nothing of a batch of 4."""
    limit = min(limit, seq.room)
    if limit < 2:
        return 1, {}
    base = len(seq.tokens)
    probe = [(1000 + 7919 * i) % seq.ctx.n_vocab for i in range(limit)]
    timings: dict[int, float] = {}

    def timed_pass(tokens: list[int]) -> None:
        start = time.perf_counter()
        seq.extend(tokens, all_logits=True)
        elapsed = time.perf_counter() - start
        timings[len(tokens)] = min(timings.get(len(tokens), elapsed), elapsed)

    try:
        reference = []
        for token in probe:
            timed_pass([token])
            reference.append(seq.logits(0).copy())
        seq.truncate(base)

        def exact(n: int) -> bool:
            timed_pass(probe[:n])
            same = all(float(np.abs(seq.logits(i) - reference[i]).max()) <= tolerance for i in range(n))
            seq.truncate(base)
            return same

        largest = 1
        while largest < limit and exact(largest + 1):
            largest += 1
        return largest, timings
    finally:
        seq.truncate(base)
