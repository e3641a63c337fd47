"""The accept step: which draft tokens the target keeps, and the token it adds.

Pure: numpy rows in, (number accepted, next token) out. Row i of the target
holds its prediction after the i-th token of [last, d1..dk], so row i judges
draft token d(i+1) and row k gives the bonus token when all are accepted.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from edgespec.engine.sampling import greedy, sample


def accept_greedy(draft: Sequence[int], target_logits: Sequence[np.ndarray]) -> tuple[int, int]:
    """Keep draft tokens while they equal the target's argmax; the argmax at the
    first mismatch (or after the last draft token) is the free token."""
    for i, token in enumerate(draft):
        best = greedy(target_logits[i])
        if best != token:
            return i, best
    return len(draft), greedy(target_logits[len(draft)])


def accept_sampled(
    draft: Sequence[int],
    draft_probs: np.ndarray | None,
    target_probs: Sequence[np.ndarray],
    rng: np.random.Generator,
) -> tuple[int, int]:
    """Speculative sampling (Leviathan et al. 2023, Chen et al. 2023): the output
    is distributed exactly as if sampled from the target alone.

    draft_probs holds q, the distribution each draft token was drawn from
    (one row per token, over the target's vocabulary); None means a
    deterministic proposal (prompt lookup), i.e. q is a point mass on the
    proposed token.
    """
    for i, token in enumerate(draft):
        p = target_probs[i]
        q = _point_mass(token, p.size) if draft_probs is None else draft_probs[i]
        # q >= p: accept with probability p/q; q < p: always accept.
        if rng.random() * q[token] < p[token]:
            continue
        # Rejected: draw from what the target wants and the draft over-proposed.
        residual = np.maximum(p - q, 0.0)
        total = residual.sum()
        return i, sample(residual / total if total > 0 else p, rng)
    return len(draft), sample(target_probs[len(draft)], rng)


def _point_mass(token: int, size: int) -> np.ndarray:
    q = np.zeros(size)
    q[token] = 1.0
    return q
