"""A token index over many documents: what followed the end of the history before.

Documents are token sequences with a name (a conversation, "file:<sha256>",
"request:<hash>", ...). `SuffixIndex.match(history)` finds the longest suffix of
the history that occurs in them and proposes what followed it, with its
evidence, as SuffixDecoding does (Oliaro et al., arXiv 2411.04975):

- a continuation's confidence is the product of child/parent counts along it
  (of the n places where the matched suffix occurs, c went on with this token);
  it is drawn until that product would fall below `min_confidence`;
- it is at most as long as the matched suffix, plus a token for each doubling
  of the places where the suffix occurs (a 4-token match seen once proposes at
  most 4 tokens; seen 16 times, 8);
- candidates are ranked by the tokens they are expected to get accepted (the
  sum of the confidences of their prefixes), then by match length, then count.

How it is stored: all documents in one int32 array, each followed by SEP (and
the array starts with one), so no match or continuation crosses a document.
Every token position has a key packing that token and the two before it, and
the positions are kept sorted by key: a match of up to three tokens is one
binary search (`np.searchsorted`), and each further token of the match filters
the positions found. Adding is lazy: documents wait until the next match, then
are merged into the sorted keys (or all keys are sorted again when many wait),
so a reply added per turn costs O(n) copying, not a rebuild. Removing a
document compacts the arrays in O(n). Memory: 16 bytes a token (the token,
its key, its position). Documents are evicted least recently used first when
adding goes over `budget_bytes`.

Not thread-safe: one thread (the engine's) uses an index.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

import numpy as np

SEP = -1
"""Stored after each document (and once at the start): matches stop at it."""
_BITS = 21
_MASK = (1 << _BITS) - 1
MAX_TOKEN = _MASK - 1
"""The largest token id an index holds (vocabularies up to two million tokens)."""
BYTES_PER_TOKEN = 16
"""What a stored token costs: 4 for the token, 8 for its key, 4 for its position."""
DOC_OVERHEAD = 256
"""What a document costs besides its tokens (its name, times, offsets), roughly."""
MAX_MATCH = 64
"""How far back the history is matched by default (SuffixDecoding's tree depth)."""
MIN_CONFIDENCE = 0.1
"""A continuation stops before its confidence falls below this (SuffixDecoding's default)."""
_FEW = 64
"""Where a match holds this many places or fewer, the rest of the history is compared at once."""
_MAX_PLACES = 4096
"""Where a suffix occurs in more places, its continuations are followed in an even sample of this many."""
_SAMPLE = 256
"""Where more places follow a match, the likeliest next tokens are chosen from this many of them."""
_MERGE_FRACTION = 4
"""Waiting documents are merged into the sorted keys while they hold under 1/4 of
the tokens already sorted; beyond that, all keys are sorted again."""


@dataclass(frozen=True)
class Candidate:
    """A continuation of the history found in the documents, with its evidence."""

    tokens: tuple[int, ...]
    """The proposed tokens, in order."""
    count: int
    """How many times these tokens followed the matched suffix (estimated from an even
    sample where the suffix occurs in more than _MAX_PLACES places)."""
    occurrences: int
    """How many times the matched suffix occurs (followed by anything, or by a document's end)."""
    match_len: int
    """How many tokens at the end of the history matched."""
    confidence: float
    """The product of child/parent counts along the whole continuation."""
    expected: float
    """Tokens expected to be accepted: the sum of the confidences of each prefix."""
    docs: tuple[str, ...]
    """The documents the continuation was found in, most occurrences first."""


class SuffixIndex:
    """Token sequences from many documents, matched against a history."""

    def __init__(self, *, budget_bytes: int | None = None):
        """`budget_bytes`: the most the index holds (BYTES_PER_TOKEN a token plus
        DOC_OVERHEAD a document); None: no limit; 0: nothing is kept."""
        if budget_bytes is not None and budget_bytes < 0:
            raise ValueError(f"budget_bytes must be 0 or more, not {budget_bytes}")
        self.budget_bytes = budget_bytes
        self._used: dict[str, float] = {}
        """Every document (stored or waiting) -> when it was last added or touched."""
        self._tick = 0
        self._order_of_use: dict[str, int] = {}
        """Ties in `_used` broken by the order of use."""
        self._lengths: dict[str, int] = {}
        self._waiting: dict[str, np.ndarray] = {}
        """Documents added since the arrays were last brought up to date."""
        # the stored documents, in the order of their blocks in _text
        self._names: list[str] = []
        self._starts = np.zeros(0, dtype=np.int64)
        self._text = np.full(1, SEP, dtype=np.int32)
        self._keys = np.zeros(0, dtype=np.int64)
        self._positions = np.zeros(0, dtype=np.int32)
        """Token positions in _text, sorted by their key."""

    # --- documents ---------------------------------------------------------

    @property
    def n_tokens(self) -> int:
        """Tokens held, over all documents."""
        return sum(self._lengths.values())

    @property
    def nbytes(self) -> int:
        """The memory the index accounts for: BYTES_PER_TOKEN a token (and a separator)
        plus DOC_OVERHEAD a document."""
        return sum(_cost(n) for n in self._lengths.values())

    def __contains__(self, doc: str) -> bool:
        return doc in self._used

    def __len__(self) -> int:
        return len(self._used)

    def documents(self) -> list[str]:
        """Every document's name, least recently used first."""
        return sorted(self._used, key=self._age)

    def last_used(self, doc: str) -> float:
        """When `doc` was last added or touched (time.time())."""
        return self._used[doc]

    def tokens(self, doc: str) -> np.ndarray:
        """A read-only view of `doc`'s tokens."""
        if doc in self._waiting:
            view = self._waiting[doc]
        else:
            start = int(self._starts[self._names.index(doc)])
            view = self._text[start:start + self._lengths[doc]]
        view = view.view()
        view.flags.writeable = False
        return view

    def add(self, doc: str, tokens: Sequence[int] | np.ndarray, *, last_used: float | None = None) -> list[str]:
        """Hold `tokens` as document `doc`, replacing what it held before, and make it
        the most recently used (or place it in the order of use at `last_used`).
        Returns the documents evicted to stay within the budget. A document larger
        than the whole budget keeps its last tokens that fit."""
        array = _checked(tokens)
        if doc in self._used:
            if np.array_equal(self.tokens(doc), array):  # the same again: only used now
                self._stamp(doc, time.time() if last_used is None else last_used)
                return []
            self.remove(doc)
        if self.budget_bytes is not None:
            room = (self.budget_bytes - DOC_OVERHEAD) // BYTES_PER_TOKEN - 1
            if room < len(array):
                array = array[len(array) - max(room, 0):]
        if len(array) == 0:
            return []
        self._waiting[doc] = array
        self._lengths[doc] = len(array)
        self._stamp(doc, time.time() if last_used is None else last_used)
        return self._evict(keep=doc)

    def touch(self, doc: str, *, when: float | None = None) -> None:
        """Mark `doc` as used now (it is the last to be evicted)."""
        if doc in self._used:
            self._stamp(doc, time.time() if when is None else when)

    def remove(self, doc: str) -> None:
        """Forget `doc`: its tokens are no longer matched or proposed. No-op if absent."""
        self._drop([doc])

    def clear(self) -> None:
        self._drop(list(self._used))

    def _stamp(self, doc: str, when: float) -> None:
        self._tick += 1
        self._used[doc] = when
        self._order_of_use[doc] = self._tick

    def _age(self, doc: str) -> tuple[float, int]:
        return self._used[doc], self._order_of_use[doc]

    def _evict(self, *, keep: str) -> list[str]:
        if self.budget_bytes is None:
            return []
        over = self.nbytes - self.budget_bytes
        evicted = []
        for doc in self.documents():
            if over <= 0:
                break
            if doc != keep:
                evicted.append(doc)
                over -= _cost(self._lengths[doc])
        self._drop(evicted)
        return evicted

    def _drop(self, docs: list[str]) -> None:
        stored = []
        for doc in docs:
            if doc not in self._used:
                continue
            del self._used[doc], self._order_of_use[doc], self._lengths[doc]
            if self._waiting.pop(doc, None) is None:
                stored.append(doc)
        if not stored:
            return
        gone = set(stored)
        ends = [*self._starts[1:].tolist(), len(self._text)]  # a block: a document's tokens and its SEP
        keep = np.ones(len(self._text), dtype=bool)
        for i, name in enumerate(self._names):
            if name in gone:
                keep[int(self._starts[i]):ends[i]] = False
        new_position = np.cumsum(keep, dtype=np.int64) - 1
        kept = keep[self._positions]
        self._positions = new_position[self._positions[kept]].astype(np.int32)
        self._keys = self._keys[kept]
        self._text = self._text[keep]
        kept_docs = [i for i, name in enumerate(self._names) if name not in gone]
        self._starts = new_position[self._starts[kept_docs]]
        self._names = [self._names[i] for i in kept_docs]

    # --- the arrays ----------------------------------------------------------

    def _store_waiting(self) -> None:
        """Bring the waiting documents into the sorted arrays."""
        if not self._waiting:
            return
        base = len(self._text)
        blocks, starts, offset = [], [], base
        for doc, tokens in self._waiting.items():
            self._names.append(doc)
            starts.append(offset)
            blocks.append(tokens)
            blocks.append(np.full(1, SEP, dtype=np.int32))
            offset += len(tokens) + 1
        self._waiting.clear()
        added = np.concatenate(blocks)
        self._starts = np.concatenate([self._starts, np.asarray(starts, dtype=np.int64)])
        if len(added) * _MERGE_FRACTION < len(self._keys):
            # merge: sort the new keys alone, then insert them where they belong
            with_sep = np.concatenate([np.full(1, SEP, dtype=np.int32), added])
            positions, keys = _keyed(with_sep)
            order = np.argsort(keys, kind="stable")
            keys, positions = keys[order], positions[order] + (base - 1)
            at = np.searchsorted(self._keys, keys, side="right")
            self._keys = np.insert(self._keys, at, keys)
            self._positions = np.insert(self._positions, at, positions.astype(np.int32))
            self._text = np.concatenate([self._text, added])
        else:
            self._text = np.concatenate([self._text, added])
            positions, keys = _keyed(self._text)
            order = np.argsort(keys, kind="stable")
            self._keys = keys[order]
            self._positions = positions[order].astype(np.int32)

    # --- matching ------------------------------------------------------------

    def match(self, history: Sequence[int] | np.ndarray, *, max_len: int, max_match: int = MAX_MATCH,
              min_confidence: float = MIN_CONFIDENCE, limit: int = 4) -> list[Candidate]:
        """Continuations of `history` found in the documents, best first (at most
        `limit`, each at most `max_len` tokens): from the longest suffix of the
        history (up to `max_match` tokens) that occurs in them, the most frequent
        continuation and the runner-up's; then from shorter suffixes that occur in
        more places."""
        if max_len <= 0 or limit <= 0 or not self._used:
            return []
        self._store_waiting()
        tail = np.asarray(history[-max_match:], dtype=np.int64)
        if len(tail) == 0:
            return []
        nodes = self._nodes(tail[::-1])
        candidates: list[Candidate] = []
        seen: set[tuple[int, ...]] = set()
        for rank, (length, positions) in enumerate(nodes[:limit]):
            cap = min(max_len, length + int(math.log2(len(positions))))
            firsts = 2 if rank == 0 else 1
            for candidate in self._continuations(positions, length, cap, min_confidence, firsts):
                if candidate.tokens not in seen:
                    seen.add(candidate.tokens)
                    candidates.append(candidate)
        candidates.sort(key=lambda c: (-c.expected, -c.match_len, -c.count))
        return candidates[:limit]

    def _nodes(self, backwards: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """(match length, positions of the history's last token there) for each suffix
        of the history that occurs in more places than the next longer one, longest first.
        `backwards` is the history's tail, last token first."""
        if not (0 <= backwards[0] <= MAX_TOKEN):
            return []
        bad = np.flatnonzero((backwards < 0) | (backwards > MAX_TOKEN))
        usable = backwards[: bad[0]] if len(bad) else backwards
        depth = min(3, len(usable))
        # keys of 1, 2 and 3 tokens: token, token before, the one before that
        lows = [usable[0] << (2 * _BITS)]
        if depth > 1:
            lows.append(lows[0] | (usable[1] << _BITS))
        if depth > 2:
            lows.append(lows[1] | usable[2])
        widths = [1 << (2 * _BITS), 1 << _BITS, 1][:depth]
        bounds = np.searchsorted(self._keys, np.array([*lows, *[lo + w for lo, w in zip(lows, widths)]]))
        ranges = [(int(bounds[i]), int(bounds[i + depth])) for i in range(depth)]
        found = [(d + 1, lo, hi) for d, (lo, hi) in enumerate(ranges) if hi > lo]
        if not found:
            return []
        nodes: list[tuple[int, np.ndarray]] = []
        previous = None
        for length, lo, hi in found:
            if previous is not None and previous[1].size > hi - lo:
                nodes.append(previous)
            previous = (length, self._positions[lo:hi])
        length, positions = previous
        # beyond three tokens: keep the positions preceded by the next history tokens
        while length < len(usable) and len(positions) > _FEW:
            preceded = positions[self._text[positions - length] == usable[length]]
            if len(preceded) == 0:
                break
            if len(preceded) < len(positions):
                nodes.append((length, positions))
            length, positions = length + 1, preceded
        if length < len(usable) and len(positions) <= _FEW:
            # a few places left: compare all the rest of the history at once
            back = np.arange(length, len(usable))
            same = self._text[np.maximum(positions[:, None] - back, 0)] == usable[length:]
            totals = length + np.where(same.all(axis=1), len(back), same.argmin(axis=1))
            # shortest first, each holding the places that match at least that far
            nodes.extend((int(total), positions[totals >= total]) for total in np.unique(totals))
        else:
            nodes.append((length, positions))
        return nodes[::-1]

    def _continuations(self, positions: np.ndarray, length: int, cap: int, min_confidence: float,
                       firsts: int) -> list[Candidate]:
        """The most frequent continuations after `positions` (where a match of `length`
        tokens ends): one for each of the `firsts` most frequent first tokens."""
        occurrences = len(positions)
        if occurrences > _MAX_PLACES:  # followed in an even sample, counts scaled up
            positions = positions[:: occurrences // _MAX_PLACES]
        following = self._text[positions + 1]
        result = []
        for first, count in _top(following, firsts):
            confidence = count / len(positions)
            if confidence < min_confidence:
                break
            result.append(self._walk(positions[following == first], first, confidence, occurrences,
                                     length, cap, min_confidence, scale=occurrences / len(positions)))
        return result

    def _walk(self, positions: np.ndarray, first: int, confidence: float, occurrences: int,
              length: int, cap: int, min_confidence: float, scale: float) -> Candidate:
        """Follow the most frequent path from `first` (which followed `positions`)
        while its confidence stays at or above min_confidence, up to `cap` tokens."""
        tokens, expected = [first], confidence
        while len(tokens) < cap:
            if len(positions) <= _FEW:  # their next tokens as lists, followed in Python
                ahead = positions[:, None] + 1 + np.arange(len(tokens), cap)
                rows = self._text[np.minimum(ahead, len(self._text) - 1)].tolist()
                places = list(range(len(rows)))
                for column in range(len(rows[0])):
                    if len(places) == 1:  # one place left: the rest of its row, each step certain
                        rest = rows[places[0]][column:]
                        rest = rest[: rest.index(SEP)] if SEP in rest else rest
                        tokens.extend(rest)
                        expected += confidence * len(rest)
                        break
                    token, count = _most_common([rows[i][column] for i in places])
                    if count == 0 or confidence * count / len(places) < min_confidence:
                        break
                    confidence *= count / len(places)
                    expected += confidence
                    tokens.append(token)
                    places = [i for i in places if rows[i][column] == token]
                positions = positions[places]
                break
            following = self._text[positions + 1 + len(tokens)]
            best = _top(following, 1)
            if not best or confidence * best[0][1] / len(positions) < min_confidence:
                break
            token, count = best[0]
            confidence *= count / len(positions)
            expected += confidence
            tokens.append(token)
            positions = positions[following == token]
        return Candidate(tokens=tuple(tokens), count=round(len(positions) * scale), occurrences=occurrences,
                         match_len=length, confidence=confidence, expected=expected,
                         docs=self._docs_at(positions))

    def _docs_at(self, positions: np.ndarray) -> tuple[str, ...]:
        which = np.searchsorted(self._starts, positions, side="right") - 1
        if len(which) <= _FEW:
            ranked = sorted(Counter(which.tolist()).items(), key=lambda ic: (-ic[1], ic[0]))
            return tuple(self._names[i] for i, _ in ranked)
        indices, counts = np.unique(which, return_counts=True)
        return tuple(self._names[i] for i in indices[np.argsort(-counts, kind="stable")].tolist())


def _top(following: np.ndarray, n: int) -> list[tuple[int, int]]:
    """The `n` most frequent tokens of `following` other than SEP, with their counts,
    most frequent first (of a tie, the smaller token). Over a long array they are
    chosen from an even sample of _SAMPLE, then counted exactly."""
    if len(following) <= _FEW:
        counts = Counter(following.tolist())
        counts.pop(SEP, None)
        return sorted(counts.items(), key=lambda tc: (-tc[1], tc[0]))[:n]
    sample = following if len(following) <= _SAMPLE else following[:: len(following) // _SAMPLE]
    values, counts = np.unique(sample, return_counts=True)
    counts[values == SEP] = 0
    best = [int(values[i]) for i in np.argsort(-counts, kind="stable")[:n] if counts[i] > 0]
    if sample is following:
        return [(token, int(counts[np.searchsorted(values, token)])) for token in best]
    exact = [(token, int(np.count_nonzero(following == token))) for token in best]
    return sorted(exact, key=lambda tc: (-tc[1], tc[0]))


def _most_common(tokens: list[int]) -> tuple[int, int]:
    """The most frequent token other than SEP (the smallest of a tie) and its count; count 0: none."""
    counts = Counter(tokens)
    counts.pop(SEP, None)
    if not counts:
        return SEP, 0
    return min(counts.items(), key=lambda tc: (-tc[1], tc[0]))


def _cost(n_tokens: int) -> int:
    return (n_tokens + 1) * BYTES_PER_TOKEN + DOC_OVERHEAD


def _checked(tokens: Sequence[int] | np.ndarray) -> np.ndarray:
    array = np.asarray(tokens)
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        raise ValueError("a document's tokens are a flat sequence of integer token ids")
    if array.size and (int(array.min()) < 0 or int(array.max()) > MAX_TOKEN):
        raise ValueError(f"token ids must lie in 0..{MAX_TOKEN}")
    return array.astype(np.int32, copy=True)


def _keyed(text: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(position, key) of each token in `text` (which starts with SEP): the key packs
    the token, the one before it and the one before that, most significant first;
    a separator, or anything before one, packs as _MASK, which no history token is."""
    t = text.astype(np.int64)
    t[t == SEP] = _MASK
    prev1 = np.concatenate([[_MASK], t[:-1]])
    prev2 = np.concatenate([[_MASK, _MASK], t[:-2]])
    prev2[prev1 == _MASK] = _MASK
    keys = (t << (2 * _BITS)) | (prev1 << _BITS) | prev2
    positions = np.flatnonzero(t != _MASK)
    return positions, keys[positions]
