"""A second, smaller GGUF model as the drafter."""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from edgespec.engine.cache import KVSequence, common_prefix_length
from edgespec.engine.drafters.base import Draft, Drafter, too_unsure
from edgespec.engine.sampling import distribution, greedy, sample, top_probability


class DraftModel(Drafter):
    """A second, smaller GGUF model with the target's vocabulary.

    The two may count a few more or fewer token slots (llama.cpp pairs them when
    the sizes differ by up to 128, as Qwen2.5 7B's 152064 and its 0.5B draft's
    151936 do), so the draft works over the target's ids. Ids only the draft has
    are never proposed (the target could not even read them); ids only the
    target has get probability 0, and in the history the draft reads them as
    STAND_IN. Drafting from that q keeps sampling exact: the target judges each
    token by the q it was drawn from, and only the quality of guesses is at stake.
    """

    name = "draft"
    STAND_IN = 0
    """What the draft reads for a token it does not have (the target's padding
    slots, which trained models never emit)."""

    def __init__(self, seq: KVSequence, *, is_eog=lambda token: False, n_vocab: int | None = None):
        """n_vocab: the target's vocabulary size (None: the draft's own)."""
        self.seq = seq
        self.is_eog = is_eog
        self.n_vocab = n_vocab
        self._own = seq.ctx.n_vocab if n_vocab is not None else None

    def _logits(self, logits: np.ndarray) -> np.ndarray:
        """The draft's logits over the target's ids."""
        if self.n_vocab is None or logits.size == self.n_vocab:
            return logits
        if logits.size > self.n_vocab:
            return logits[: self.n_vocab]
        return np.concatenate([logits, np.full(self.n_vocab - logits.size, -np.inf, dtype=logits.dtype)])

    def _readable(self, tokens: Sequence[int]) -> Sequence[int]:
        """The target's tokens as the draft can read them."""
        if self._own is None or self.n_vocab <= self._own or max(tokens, default=0) < self._own:
            return tokens
        return [t if t < self._own else self.STAND_IN for t in tokens]

    def propose(self, history, k, params, rng):
        tokens: list[int] = []
        rows: list[np.ndarray] = []
        before, start = self.seq.evaluated, time.perf_counter()
        logits = self._logits(self.seq.next_logits(self._readable(history)))
        caught_up, catch_up_s = self.seq.evaluated - before, time.perf_counter() - start
        whole = 1.0  # the chance that the whole draft so far is right, as the draft model sees it
        for i in range(k):
            q = distribution(logits, params) if params.temperature > 0 else None
            sure = top_probability(logits) if q is None else float(q.max())
            whole *= sure
            if too_unsure(sure, whole, params):
                break
            if q is None:
                token = greedy(logits)
            else:
                token = sample(q, rng)
                rows.append(q)
            tokens.append(token)
            if self.is_eog(token):
                break  # nothing follows the end of the reply
            if i + 1 < k and self.seq.room > 1:
                self.seq.extend([token])
                logits = self._logits(self.seq.logits(-1))
            else:
                break
        return Draft(tokens, np.stack(rows) if rows else None, caught_up, catch_up_s)

    def rewind(self, history):
        self.seq.truncate(common_prefix_length(self.seq.tokens, self._readable(history)))

    def prefill(self, prompt):
        # All of it, as the target reads it: the first draft catches up on the first token only.
        if len(prompt) < self.seq.n_ctx:
            self.seq.sync(self._readable(prompt))

    def behind(self, history):
        return len(history) - common_prefix_length(self.seq.tokens, self._readable(history))
