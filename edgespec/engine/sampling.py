"""Samplers as small pure functions: logits in, a full-vocabulary distribution out.

Draft and target go through the same `distribution()`, so that speculative
sampling compares like with like (p and q after the same transforms).
"""

from __future__ import annotations

import numpy as np

from edgespec.engine.events import GenerationParams
from edgespec.limits import LIMITS


def check_params(params: GenerationParams) -> None:
    """Raise ValueError naming the first setting out of its range (edgespec/limits.py)."""
    for name, limit in LIMITS.items():
        limit.check(getattr(params, name))  # None (seed, the server's max_tokens): not set


def softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x -= x.max()
    np.exp(x, out=x)
    x /= x.sum()
    return x


def top_k_filter(logits: np.ndarray, k: int) -> np.ndarray:
    """Logits with all but the k largest set to -inf (k <= 0: unchanged)."""
    if k <= 0 or k >= logits.size:
        return logits
    keep = np.argpartition(logits, -k)[-k:]
    out = np.full_like(logits, -np.inf)
    out[keep] = logits[keep]
    return out


def top_p_filter(probs: np.ndarray, p: float) -> np.ndarray:
    """The smallest set of most likely tokens whose mass reaches p, renormalised.

    Sorts only the head of the distribution: the m most likely tokens, doubling
    m until their mass reaches p (exact, and fast for the usual peaked case).
    """
    if p >= 1.0:
        return probs
    m = min(256, probs.size)
    while True:
        head = np.argpartition(probs, -m)[-m:] if m < probs.size else np.arange(probs.size)
        head = head[np.argsort(-probs[head], kind="stable")]
        cumulative = np.cumsum(probs[head])
        if cumulative[-1] >= p or m == probs.size:
            n = int(np.searchsorted(cumulative, p)) + 1
            out = np.zeros_like(probs)
            keep = head[:n]
            out[keep] = probs[keep]
            return out / out.sum()
        m = min(2 * m, probs.size)


def distribution(logits: np.ndarray, params: GenerationParams) -> np.ndarray:
    """Temperature, then top-k, then top-p: the distribution tokens are drawn from."""
    # Shifted so that the largest is 0 before dividing, in float64: a tiny temperature then gives
    # -inf (probability 0) below the largest logit, where float32 logits overflowed to inf and NaN.
    with np.errstate(over="ignore"):
        scaled = (logits.astype(np.float64) - logits.max()) / params.temperature
    return top_p_filter(softmax(top_k_filter(scaled, params.top_k)), params.top_p)


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one token id from a distribution (inverse CDF, one uniform number)."""
    cdf = np.cumsum(probs)
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), probs.size - 1))


def greedy(logits: np.ndarray) -> int:
    return int(np.argmax(logits))


def top_probability(logits: np.ndarray) -> float:
    """Probability of the most likely token under the raw logits (softmax max).
    Float32 is plenty for a threshold, and this runs once per drafted token."""
    return float(1.0 / np.exp(logits - logits.max()).sum(dtype=np.float64))
