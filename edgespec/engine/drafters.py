"""Drafters propose the next few tokens; the target checks them.

One small interface, so that a new drafter is a new class and tests can swap
in a fake: `propose(history, k, params, rng) -> Draft`, plus `rewind(history)`
called after each cycle with the accepted tokens.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from edgespec.engine.cache import KVSequence, common_prefix_length
from edgespec.engine.events import GenerationParams
from edgespec.engine.sampling import distribution, greedy, sample, top_probability


@dataclass
class Draft:
    tokens: list[int]
    probs: np.ndarray | None = None
    """q: one row per token, the distribution it was drawn from (sampling with a
    draft model); None for a deterministic proposal (greedy, prompt lookup)."""
    caught_up: int = 0
    """Tokens the drafter evaluated to catch up with the history before drafting:
    1 or 2 when it drafted last cycle too, many after it sat idle."""
    catch_up_s: float = 0.0
    """Seconds that catch-up took."""


class Drafter(ABC):
    name: str

    @abstractmethod
    def propose(self, history: Sequence[int], k: int, params: GenerationParams,
                rng: np.random.Generator) -> Draft:
        """Up to k tokens likely to follow `history` (fewer, or none, is fine)."""

    def rewind(self, history: Sequence[int]) -> None:
        """The cycle is over and `history` is what was accepted: drop the rest."""

    def behind(self, history: Sequence[int]) -> int:
        """Tokens of `history` the drafter would have to read before drafting."""
        return 0


class DraftModel(Drafter):
    """A second, smaller GGUF model with the target's vocabulary."""

    name = "draft"

    def __init__(self, seq: KVSequence, *, is_eog=lambda token: False):
        self.seq = seq
        self.is_eog = is_eog

    def propose(self, history, k, params, rng):
        tokens: list[int] = []
        rows: list[np.ndarray] = []
        before, start = self.seq.evaluated, time.perf_counter()
        logits = self.seq.next_logits(history)
        caught_up, catch_up_s = self.seq.evaluated - before, time.perf_counter() - start
        for i in range(k):
            if params.temperature == 0:
                # Stop when the draft itself is unsure: a likely rejection costs a target column.
                if top_probability(logits) < params.p_min:
                    break
                token = greedy(logits)
            else:
                q = distribution(logits, params)
                if q.max() < params.p_min:
                    break
                token = sample(q, rng)
                rows.append(q)
            tokens.append(token)
            if self.is_eog(token):
                break  # nothing follows the end of the reply
            if i + 1 < k and self.seq.room > 1:
                self.seq.extend([token])
                logits = self.seq.logits(-1)
            else:
                break
        return Draft(tokens, np.stack(rows) if rows else None, caught_up, catch_up_s)

    def rewind(self, history):
        self.seq.truncate(common_prefix_length(self.seq.tokens, history))

    def behind(self, history):
        return len(history) - common_prefix_length(self.seq.tokens, history)


class PromptLookup(Drafter):
    """n-gram lookup over the tokens already in the context: no second model.

    Finds the most recent earlier occurrence of the last n tokens (n from
    ngram_max down to ngram_min) and proposes what followed it.
    """

    name = "lookup"

    def __init__(self, *, ngram_max: int = 4, ngram_min: int = 2):
        self.ngram_max = ngram_max
        self.ngram_min = ngram_min

    def propose(self, history, k, params, rng):
        return Draft(self.lookup(history, k))

    def lookup(self, history: Sequence[int], k: int) -> list[int]:
        return self.match(history, k)[0]

    def match(self, history: Sequence[int], k: int) -> tuple[list[int], int]:
        """The proposal and the length n of the n-gram it was found by (0: none).
        Longer matches predict better; auto mode tracks acceptance per n."""
        if k <= 0:
            return [], 0
        arr = np.asarray(history, dtype=np.int64)
        for n in range(min(self.ngram_max, len(arr) - 1), self.ngram_min - 1, -1):
            tail = arr[-n:]
            # Start positions of every earlier n-gram equal to the tail (the tail itself excluded).
            starts = np.flatnonzero(arr[: len(arr) - n] == tail[0])
            for j in range(1, n):
                starts = starts[arr[starts + j] == tail[j]]
            if starts.size:
                begin = int(starts[-1]) + n
                return arr[begin : begin + k].tolist(), n
        return [], 0
