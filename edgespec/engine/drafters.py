"""Drafters propose the next few tokens; the target checks them.

One small interface, so that a new drafter is a new class and tests can swap
in a fake: `propose(history, k, params, rng) -> Draft`, plus `rewind(history)`
called after each cycle with the accepted tokens, and `offer(history, k_max)`:
what a policy that prices drafters (auto mode) may expect of it next cycle.
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


@dataclass(frozen=True)
class Offer:
    """What a drafter can give the next cycle, said before it drafts: what auto mode prices."""

    k_max: int
    """The longest draft worth asking it for (0: it has nothing to offer)."""
    key: str | None = None
    """Which of the drafter's acceptance rates predicts this draft (prompt lookup:
    the kind of match it made); None: its one rate."""
    proposal: list[int] | None = None
    """The draft itself, when making it costs nothing (prompt lookup): priced as it
    is, and scored against what the cycle produced when another plan is taken.
    None: drafted on demand, in the cycle (a draft model), so its acceptance is
    only learnt by using it."""


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

    def prefill(self, prompt: Sequence[int]) -> None:
        """Read the prompt while the target reads it, so that drafting starts warm."""

    def offer(self, history: Sequence[int], k_max: int) -> Offer:
        """What the drafter can give the cycle after `history`, at most `k_max` tokens."""
        return Offer(k_max)


def too_unsure(sure: float, whole: float, params: GenerationParams) -> bool:
    """Whether a draft model stops before a guess it gives probability `sure`,
    with `whole` the chance that its draft including that guess is right: a
    likely rejection costs a target column."""
    return sure < params.p_min or (params.p_draft is not None and whole < params.p_draft)


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


class PromptLookup(Drafter):
    """n-gram lookup over the tokens already in the context: no second model.

    Finds an earlier occurrence of the last n tokens (n from ngram_max down to
    ngram_min) and proposes what followed it. Of several occurrences it takes
    the one whose preceding tokens agree longest with the history (the place
    the reply is copying from: in code the same line often occurs twice),
    the most recent one on a tie.

    A reply that copies with edits (rename a variable, fix a typo) writes a
    token that occurs nowhere before, and no n-gram ending in it matches. Then
    lookup can assume that token replaced the one the copy was at, and propose
    what follows that one ("skip").
    """

    name = "lookup"
    CONTEXT_MAX = 32
    """How far back occurrences are compared to choose between them."""
    KINDS_MAX = 8
    """Agreeing contexts longer than this are one kind ("8-gram") for auto's acceptance tracking."""

    def __init__(self, *, ngram_max: int = 4, ngram_min: int = 2):
        self.ngram_max = ngram_max
        self.ngram_min = ngram_min

    def propose(self, history, k, params, rng):
        return Draft(self.lookup(history, k))

    def offer(self, history, k_max):
        tokens, kind = self.match(history, k_max, skip=True)
        return Offer(len(tokens), kind or "none", tokens)

    def lookup(self, history: Sequence[int], k: int) -> list[int]:
        return self.match(history, k)[0]

    def match(self, history: Sequence[int], k: int, *, skip: bool = False) -> tuple[list[int], str]:
        """The proposal and how it was found: "N-gram" with N the length of the
        agreeing context (capped at KINDS_MAX; longer agreement predicts better, and
        auto mode tracks acceptance per kind), "skip" (only when asked for:
        right on renames, wrong on most other edits, so only worth it to a
        policy that learns which), or "" for none."""
        if k <= 0:
            return [], ""
        arr = np.asarray(history, dtype=np.int64)
        found = self._find(arr, len(arr))
        if found is not None:
            begin, context = found
            return arr[begin : begin + k].tolist(), f"{min(context, self.KINDS_MAX)}-gram"
        if skip and len(arr) > 2:
            found = self._find(arr, len(arr) - 1)  # the context before the new token
            if found is not None and found[0] + 1 < len(arr):
                begin = found[0] + 1  # past the token the new one replaced
                return arr[begin : begin + k].tolist(), "skip"
        return [], ""

    def _find(self, arr: np.ndarray, end: int) -> tuple[int, int] | None:
        """Where the continuation of arr[:end]'s last n-gram starts (at an
        earlier occurrence), and how many tokens of context agree there."""
        for n in range(min(self.ngram_max, end - 1), self.ngram_min - 1, -1):
            tail = arr[end - n : end]
            # Start positions of every earlier n-gram equal to the tail (the tail itself excluded).
            starts = np.flatnonzero(arr[: end - n] == tail[0])
            for j in range(1, n):
                starts = starts[arr[starts + j] == tail[j]]
            if starts.size:
                agree = np.zeros(starts.size, dtype=np.int64)
                alive = np.ones(starts.size, dtype=bool)
                for j in range(1, min(self.CONTEXT_MAX, end - n) + 1):
                    alive &= starts - j >= 0
                    alive[alive] = arr[starts[alive] - j] == arr[end - n - j]
                    if not alive.any():
                        break
                    agree += alive
                best = int(np.argmax(agree * (len(arr) + 1) + starts))  # most agreement, then most recent
                return int(starts[best]) + n, n + int(agree[best])
        return None
