"""A second, smaller GGUF model as the drafter."""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from edgespec.engine.cache import KVSequence, common_prefix_length
from edgespec.engine.drafters.base import Draft, Drafter, too_unsure
from edgespec.engine.drafters.hints import HintRule
from edgespec.engine.drafters.lookup import PromptLookup
from edgespec.engine.sampling import distribution, greedy, sample, top_probability


MERGED_CATCH_UP = 4
"""Tokens a draft model may have missed and still read a cycle's first hints in the same pass."""


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

    def __init__(self, seq: KVSequence, *, is_eog=lambda token: False, n_vocab: int | None = None,
                 hints: PromptLookup | None = None):
        """n_vocab: the target's vocabulary size (None: the draft's own)."""
        self.seq = seq
        self.is_eog = is_eog
        self.n_vocab = n_vocab
        self._own = seq.ctx.n_vocab if n_vocab is not None else None
        self.hints = hints
        self.hint_rule = HintRule()
        self._text: list[int] = []
        """The history and the draft so far, for `hints` (one list kept, so that its lookup extends its index)."""

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
        text = self._context(history)
        ahead = self._hints(text, k)  # hints read past the draft so far: `logits` is the row before ahead[0]
        before, start = self.seq.evaluated, time.perf_counter()
        row = self._read(self._readable(history), self._readable(ahead))  # that row's index in the last batch
        if row is None:
            ahead, row = [], -1
        logits = self._logits(self.seq.logits(row))
        caught_up, catch_up_s = self.seq.evaluated - before - len(ahead), time.perf_counter() - start
        rounds = [(0, ahead[:])] if ahead else []  # (where in the draft each batch of hints was read, the hints)
        passes, hinted = 1, len(ahead)
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
            text.append(token)
            if self.is_eog(token) or i + 1 >= k:
                break  # nothing follows the end of the reply; the last guess is never read
            if ahead and ahead[0] == token:  # a hint guessed it: the row after it is read already
                ahead.pop(0)
                row += 1
                logits = self._logits(self.seq.logits(row))
                continue
            if ahead:  # it went another way: the hints past here are not its text
                self.seq.truncate(len(self.seq.tokens) - len(ahead))
            if self.seq.room <= 1:
                break
            ahead = self._hints(text, k - i - 1)
            if ahead:
                rounds.append((len(tokens), ahead[:]))
            t = time.perf_counter()
            self.seq.extend(self._readable([token, *ahead]), all_logits=bool(ahead))
            passes, hinted = passes + 1, hinted + len(ahead)
            row = 0 if ahead else -1
            logits = self._logits(self.seq.logits(row))
            self.hint_rule.timed(1 + len(ahead), time.perf_counter() - t)
        for at, read in rounds:
            self.hint_rule.observe(read, tokens[at:])
        self._cut(len(history))
        return Draft(tokens, np.stack(rows) if rows else None, caught_up, catch_up_s, passes=passes, hints=hinted)

    def _read(self, history: Sequence[int], hints: Sequence[int]) -> int | None:
        """Bring the cache to `history`, with `hints` read in the same pass after it when
        it misses only a few tokens (a steady cycle's two): the index, in that pass, of
        the row after history's last token. None: read without them (a long catch-up, whose
        every row would be computed for nothing), their rows not there."""
        held = min(common_prefix_length(self.seq.tokens, history), len(history) - 1)
        missed = history[held:]
        if (not hints or len(missed) > MERGED_CATCH_UP
                or len(missed) + len(hints) > min(self.seq.room, self.seq.ctx.n_batch)):
            self.seq.next_logits(history)
            return None
        self.seq.truncate(held)
        self.seq.extend([*missed, *hints], all_logits=True)
        return len(missed) - 1

    def _context(self, history) -> list[int]:
        """`_text` made to hold `history`, reusing what it holds of it."""
        text = self._text
        held = common_prefix_length(text, history)
        self._cut(held)
        text.extend(history[held:])
        return text

    def _cut(self, n: int) -> None:
        """`_text` cut to its first n tokens, and lookup's index of it with it."""
        if n < len(self._text):
            del self._text[n:]
            if self.hints is not None:
                self.hints.shortened(n)

    def _hints(self, text: list[int], most: int) -> list[int]:
        """What prompt lookup guesses follows `text`, as far as reading it is expected to pay."""
        most = min(most, self.seq.room - 2)  # the draft's next token goes in with them
        if self.hints is None or most <= 0:
            return []
        guess = self.hints.lookup(text, min(most, self.seq.ctx.n_batch - 1))
        return guess[: self.hint_rule.length(len(guess))]

    def rewind(self, history):
        self.seq.truncate(common_prefix_length(self.seq.tokens, self._readable(history)))

    def prefill(self, prompt):
        # All of it, as the target reads it: the first draft catches up on the first token only.
        if len(prompt) < self.seq.n_ctx:
            self.seq.sync(self._readable(prompt))

    def behind(self, history):
        return len(history) - common_prefix_length(self.seq.tokens, self._readable(history))
