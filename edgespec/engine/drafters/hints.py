"""Hints: prompt lookup's guesses read by a draft model in one batch.

A draft model drafts a token a pass. Where the reply copies earlier text, prompt
lookup already guesses what follows, for nothing: the draft model reads those
guesses in one batched pass, whose rows give its own next token after each of
them. Where its token is the hint's, the row after it is already computed, so a
run of hints it agrees with costs one pass instead of a pass a token. The draft
is token for token the model's own (each row is its prediction after the same
prefix, and a sampled token is drawn from that row as it would be alone); only
its cost changes. A hint token the model does not agree with costs a column of
the batch for nothing, so hints are read only as far as they are expected to
pay (HintRule), from what agreement and columns were measured to be.
"""

from __future__ import annotations

from typing import Sequence


class HintRule:
    """How many hint tokens a draft model reads with its next token: the n-th while
    the chance that it agrees with the first n (measured, per token) times a step's
    seconds is at least a column's (measured: a batch's seconds beyond a step's, a
    token). Where reading hints would not pay, one is read every PROBE_EVERY rounds
    so that agreement stays measured."""

    PRIOR = 0.5
    """Agreement assumed before any is seen: a lookup match is a coin toss."""
    PRIOR_WEIGHT = 2.0
    DECAY = 0.9
    """The weight each round's evidence keeps at the next: about the last ten rounds."""
    COLUMN_SHARE = 0.5
    """A column's seconds as a share of a step's, before both are measured."""
    PROBE_EVERY = 8

    def __init__(self) -> None:
        self.agreed = self.PRIOR * self.PRIOR_WEIGHT
        self.ended = (1.0 - self.PRIOR) * self.PRIOR_WEIGHT
        self.step_s: float | None = None
        self.column_s: float | None = None
        self._declined = 0

    @property
    def agreement(self) -> float:
        """The chance that the model's next token is the next hint token, having agreed so far."""
        return self.agreed / (self.agreed + self.ended)

    @property
    def column_share(self) -> float:
        if self.step_s is None or self.column_s is None or self.step_s <= 0:
            return self.COLUMN_SHARE
        return self.column_s / self.step_s

    def length(self, available: int) -> int:
        """Hint tokens worth reading of `available`."""
        a, share, n = self.agreement, self.column_share, 0
        while n < available and a ** (n + 1) >= share:
            n += 1
        if n == 0 and available > 0:
            self._declined += 1
            if self._declined >= self.PROBE_EVERY:
                self._declined, n = 0, 1
        return n

    def observe(self, read: Sequence[int], drafted: Sequence[int]) -> None:
        """A round's hints `read` against the tokens the model drafted from the same
        place: the run that agreed, and whether it ended on a disagreement (a draft
        that ended first tells nothing of the hints past its end)."""
        if not read:
            return
        n = min(len(read), len(drafted))
        agreed = next((i for i in range(n) if read[i] != drafted[i]), n)
        self.agreed = self.DECAY * self.agreed + agreed
        self.ended = self.DECAY * self.ended + (1.0 if agreed < n else 0.0)

    def timed(self, size: int, seconds: float) -> None:
        """A pass of the draft model over `size` tokens (its next token and size - 1 hints) took `seconds`."""
        if size == 1:
            self.step_s = _ema(self.step_s, seconds)
        elif self.step_s is not None:
            self.column_s = _ema(self.column_s, max(0.0, seconds - self.step_s) / (size - 1))


EMA = 0.2


def _ema(old: float | None, value: float) -> float:
    return value if old is None else old + EMA * (value - old)
