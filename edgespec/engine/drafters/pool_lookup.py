"""The drafter that remembers: continuations found in earlier text (replies this
machine wrote, prompts it read, files attached), held in a SuffixIndex (engine/suffix.py;
kept between runs by engine/pool.py)."""

from __future__ import annotations

from typing import Sequence

from edgespec.engine.drafters.base import Draft, Drafter, Offer
from edgespec.engine.suffix import SuffixIndex


class PoolLookup(Drafter):
    """Proposes what followed the end of the history in earlier documents, when the
    evidence is strong: the history's last MIN_MATCH tokens at least matched, and
    each proposed token followed there at least MIN_CONFIDENCE of the time (the
    product of child/parent counts along the continuation, SuffixDecoding's rule).

    Earlier text is right less often than the reply's own context (on SmolLM2's
    replies, 17 % of what SuffixDecoding's defaults proposed was accepted), so it
    demands more than those defaults, and its offer names the match's length as its
    key ("long", "short"): auto learns an acceptance for each, and drops a pool
    that stops helping. The proposal costs a lookup, nothing else: offered for free,
    like prompt lookup's, and scored in cycles that do not use it."""

    name = "pool"
    MIN_MATCH = 4
    """History tokens that must match before anything is proposed: shorter matches
    of chat text are mostly coincidences."""
    LONG_MATCH = 16
    """A match this long or longer is its own key: the reply is copying earlier text."""
    MIN_CONFIDENCE = 0.3
    """A proposal stops before the chance that it is still right falls below this
    (SuffixDecoding's 0.1 proposed tokens that were rarely accepted)."""

    def __init__(self, index: SuffixIndex | None):
        self.index = index
        """The documents matched; None or empty: nothing is proposed."""

    def propose(self, history, k, params, rng):
        tokens, _, source = self._best(history, k)
        return Draft(tokens, source=source)

    def offer(self, history, k_max):
        tokens, key, source = self._best(history, k_max)
        return Offer(len(tokens), key, tokens, source=source)

    def _best(self, history: Sequence[int], k: int) -> tuple[list[int], str, str]:
        """The proposal, its key and its source ("pool/<kind of document>": "conversation",
        "request", "file"): of the candidates with a long enough match, the one
        expected to get most tokens accepted."""
        if self.index is None or k <= 0 or len(self.index) == 0:
            return [], "none", self.name
        candidates = self.index.match(history, max_len=k, min_confidence=self.MIN_CONFIDENCE, limit=2)
        best = next((c for c in candidates if c.match_len >= self.MIN_MATCH), None)
        if best is None:
            return [], "none", self.name
        key = "long" if best.match_len >= self.LONG_MATCH else "short"
        kind = best.docs[0].split(":", 1)[0] if best.docs else ""
        return list(best.tokens), key, f"{self.name}/{kind}" if kind else self.name
