"""Prompt lookup: n-gram matches in the tokens already in the context."""

from __future__ import annotations

import bisect
from typing import Sequence

import numpy as np

from edgespec.engine.drafters.base import Draft, Drafter, Offer
from edgespec.engine.regions import Regions


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
        self.regions = Regions()
        """The reply's prompt regions: a match is credited to the one its continuation lies in."""
        self._history = _GrowingArray()

    def start(self, regions):
        self.regions = regions

    def propose(self, history, k, params, rng):
        tokens, _, begin = self._match(history, k)
        return Draft(tokens, source=self._source(begin))

    def offer(self, history, k_max):
        tokens, kind, begin = self._match(history, k_max, skip=True)
        return Offer(len(tokens), kind or "none", tokens, source=self._source(begin))

    def lookup(self, history: Sequence[int], k: int) -> list[int]:
        return self.match(history, k)[0]

    def match(self, history: Sequence[int], k: int, *, skip: bool = False) -> tuple[list[int], str]:
        """The proposal and how it was found: "N-gram" with N the length of the
        agreeing context (capped at KINDS_MAX; longer agreement predicts better, and
        auto mode tracks acceptance per kind), "skip" (only when asked for:
        right on renames, wrong on most other edits, so only worth it to a
        policy that learns which), or "" for none."""
        return self._match(history, k, skip=skip)[:2]

    def _source(self, begin: int | None) -> str:
        """The source of a proposal copied from position `begin`: "lookup/<label of its region>"."""
        return self.name if begin is None else f"{self.name}/{self.regions.label_at(begin)}"

    def _match(self, history: Sequence[int], k: int, *,
               skip: bool = False) -> tuple[list[int], str, int | None]:
        """match()'s proposal and kind, and where in `history` the proposal was copied from."""
        if k <= 0:
            return [], "", None
        arr = self._history.of(history)
        found = self._find(arr, len(arr), history)
        if found is not None:
            begin, context = found
            return arr[begin : begin + k].tolist(), f"{min(context, self.KINDS_MAX)}-gram", begin
        if skip and len(arr) > 2:
            found = self._find(arr, len(arr) - 1, history)  # the context before the new token
            if found is not None and found[0] + 1 < len(arr):
                begin = found[0] + 1  # past the token the new one replaced
                return arr[begin : begin + k].tolist(), "skip", begin
        return [], "", None

    def _find(self, arr: np.ndarray, end: int, tokens: Sequence[int]) -> tuple[int, int] | None:
        """Where the continuation of arr[:end]'s last n-gram starts (at an
        earlier occurrence), and how many tokens of context agree there (exact up
        to KINDS_MAX: beyond it, context only chooses between occurrences).
        `tokens`: the same history as a list, for looking at single tokens.

        Every n-gram ending in the last token ends at an earlier place of that
        token (kept as the history grows): those places are narrowed a token at a
        time for the longer n-grams."""
        top = min(self.ngram_max, end - 1)
        if top < self.ngram_min:
            return None
        last = end - 1
        ends = [self._history.places(tokens[last], last)]  # ends[m - 1]: where the tail's last m tokens recur
        for j in range(1, top):
            ends.append(_narrowed(ends[-1], j, tokens[last - j], arr, tokens))
        for n in range(top, self.ngram_min - 1, -1):
            found = ends[n - 1]  # where every earlier n-gram equal to the tail ends (the tail itself excluded)
            if len(found) == 1:  # the usual case where a reply copies: its context only names its kind
                start = int(found[0]) - (n - 1)
                agree = 0
                while (agree < self.KINDS_MAX - n and start - agree - 1 >= 0
                       and tokens[start - agree - 1] == tokens[end - n - agree - 1]):
                    agree += 1
                return start + n, n + agree
            starts = np.asarray(found, dtype=np.int64) - (n - 1)
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


SMALL = 64
"""Up to this many places are narrowed one by one in Python; more, as an array."""


def _narrowed(places, j: int, token: int, arr: np.ndarray, tokens: Sequence[int]):
    """The places q (ascending) with `token` j tokens before them."""
    if len(places) <= SMALL:
        return [q for q in places if q >= j and tokens[q - j] == token]
    q = np.asarray(places, dtype=np.int64)
    q = q[q >= j]
    return q[arr[q - j] == token]


class _GrowingArray:
    """A history list as an int64 array, made once per reply and extended as the
    reply grows: converting a 16,000-token list afresh each cycle took 1.6 ms, most
    of what a lookup costs. The decoder's history only grows within a reply, so the
    array is extended when it is handed the same list, longer, ending as it did;
    anything else is converted anew. A mistake could only cost speed: whatever
    lookup proposes, the target verifies."""

    def __init__(self) -> None:
        self._list: Sequence[int] | None = None
        """The list last read, held so that no new list can take its id while it is compared."""
        self._buf = np.empty(0, dtype=np.int64)
        self._n = 0
        self._places: dict[int, list[int]] = {}
        """Where each token occurs in the history, ascending."""

    def places(self, token: int, before: int) -> list[int]:
        """Where `token` occurs before position `before`, ascending."""
        where = self._places.get(token, [])
        return where[: bisect.bisect_left(where, before)]

    def of(self, history: Sequence[int]) -> np.ndarray:
        n, have = len(history), self._n
        grown = (history is self._list and have <= n
                 and (have == 0 or history[have - 1] == self._buf[have - 1]))
        if not grown:
            have = 0
            self._places = {}
        if n > len(self._buf):
            buf = np.empty(max(n, 2 * len(self._buf), 1024), dtype=np.int64)
            buf[:have] = self._buf[:have]
            self._buf = buf
        if n > have:
            self._buf[have:n] = history[have:n]
            places = self._places
            for i in range(have, n):
                places.setdefault(history[i], []).append(i)
        self._list, self._n = history, n
        return self._buf[:n]
