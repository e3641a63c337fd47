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
the positions found. Positions added since the last sort are scanned instead,
and sorted in (O(n) copying) once they number over 1/8 of the sorted ones, so
adding a document costs about what its tokens do, and so does adding tokens to
the end of the last document added (a conversation as it grows: `extend`, or
`add` with its tokens so far). Removing a document compacts the arrays in O(n).
Memory: 16 bytes a token (the token, its key, its position). Documents are
evicted least recently used first when adding goes over `budget_bytes`.

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
_TAIL_MIN = 8192
_TAIL_FRACTION = 8
"""Positions added since the last sort are scanned when matching until they number
over _TAIL_MIN and 1/_TAIL_FRACTION of the sorted ones; then they are sorted in."""


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

    def __init__(self, *, budget_bytes: int | None = None, vocab_size: int | None = None):
        """`budget_bytes`: the most the index holds (BYTES_PER_TOKEN a token plus
        DOC_OVERHEAD a document); None: no limit; 0: nothing is kept. `vocab_size`: the
        vocabulary's size, which every id held lies below (None: MAX_TOKEN bounds them):
        an id outside it, proposed as a draft, would fail the decode."""
        if budget_bytes is not None and budget_bytes < 0:
            raise ValueError(f"budget_bytes must be 0 or more, not {budget_bytes}")
        self.budget_bytes = budget_bytes
        self.vocab_size = vocab_size
        self._used: dict[str, float] = {}
        """Every document -> when it was last added or touched."""
        self._tick = 0
        self._order_of_use: dict[str, int] = {}
        """Ties in `_used` broken by the order of use."""
        self._lengths: dict[str, int] = {}
        self._names: list[str] = []
        """The documents in the order of their blocks in the text."""
        self._starts = np.zeros(0, dtype=np.int64)
        self._buffer = _Growing(np.int32, [SEP])
        """Every document's tokens followed by SEP, after one SEP."""
        self._keys = np.zeros(0, dtype=np.int64)
        self._positions = np.zeros(0, dtype=np.int32)
        """Token positions in the text, sorted by their key."""
        self._tail_keys = _Growing(np.int64)
        self._tail_positions = _Growing(np.int32)
        """Positions added since the last sort, with their keys, in the order added."""

    @property
    def _text(self) -> np.ndarray:
        return self._buffer.view

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
        """A read-only copy of `doc`'s tokens."""
        start = int(self._starts[self._names.index(doc)])
        tokens = self._text[start:start + self._lengths[doc]].copy()
        tokens.flags.writeable = False
        return tokens

    def add(self, doc: str, tokens: Sequence[int] | np.ndarray, *, last_used: float | None = None) -> list[str]:
        """Hold `tokens` as document `doc`, replacing what it held before, and make it
        the most recently used (or place it in the order of use at `last_used`).
        Returns the documents evicted to stay within the budget. A document larger
        than the whole budget keeps its last tokens that fit. Where `tokens` only
        adds to the end of the last document added, this costs what the new tokens do."""
        array = _checked(tokens, self.vocab_size)
        when = time.time() if last_used is None else last_used
        if doc in self._used:
            old = self._lengths[doc]
            if len(array) >= old and np.array_equal(self._text[self._start(doc):][:old], array[:old]):
                return self._extend(doc, array[old:], when)
            self.remove(doc)
        if self.budget_bytes is not None:
            room = (self.budget_bytes - DOC_OVERHEAD) // BYTES_PER_TOKEN - 1
            if room < len(array):
                array = array[len(array) - max(room, 0):]
        if len(array) == 0:
            return []
        start = self._buffer.size
        self._buffer.extend(np.append(array, SEP))
        self._names.append(doc)
        self._starts = np.append(self._starts, start)
        self._lengths[doc] = len(array)
        self._index_positions(np.arange(start, start + len(array)))
        self._stamp(doc, when)
        return self._evict(keep=doc)

    def extend(self, doc: str, tokens: Sequence[int] | np.ndarray) -> list[str]:
        """Add `tokens` at the end of document `doc` (a new document if it has none), as
        a conversation grows; cheap where `doc` is the last document added."""
        return self._extend(doc, _checked(tokens, self.vocab_size), time.time())

    def _extend(self, doc: str, more: np.ndarray, when: float) -> list[str]:
        if doc not in self._used:
            return self.add(doc, more, last_used=when)
        in_place = self._names[-1] == doc and (
            self.budget_bytes is None or _cost(self._lengths[doc] + len(more)) <= self.budget_bytes)
        if len(more) and not in_place:  # stored again, at the end
            tokens = np.concatenate([self.tokens(doc), more])
            self.remove(doc)
            return self.add(doc, tokens, last_used=when)
        if len(more):  # the last block: its SEP gives way to the new tokens
            start = self._buffer.size - 1
            self._buffer.size = start
            self._buffer.extend(np.append(more, SEP))
            self._lengths[doc] += len(more)
            self._index_positions(np.arange(start, start + len(more)))
        self._stamp(doc, when)
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

    def _start(self, doc: str) -> int:
        return int(self._starts[self._names.index(doc)])

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
        """Remove documents' blocks from the text and their positions from the keys."""
        gone = {doc for doc in docs if doc in self._used}
        if not gone:
            return
        for doc in gone:
            del self._used[doc], self._order_of_use[doc], self._lengths[doc]
        ends = [*self._starts[1:].tolist(), self._buffer.size]  # a block: a document's tokens and its SEP
        keep = np.ones(self._buffer.size, dtype=bool)
        for i, name in enumerate(self._names):
            if name in gone:
                keep[int(self._starts[i]):ends[i]] = False
        new_position = (np.cumsum(keep, dtype=np.int64) - 1).astype(np.int32)
        kept = keep[self._positions]
        self._positions = new_position[self._positions[kept]]
        self._keys = self._keys[kept]
        kept = keep[self._tail_positions.view]
        self._tail_positions.replace(new_position[self._tail_positions.view[kept]])
        self._tail_keys.replace(self._tail_keys.view[kept])
        self._buffer.replace(self._text[keep])
        kept_docs = [i for i, name in enumerate(self._names) if name not in gone]
        self._starts = new_position[self._starts[kept_docs]].astype(np.int64)
        self._names = [self._names[i] for i in kept_docs]

    # --- the keys ------------------------------------------------------------

    def _index_positions(self, positions: np.ndarray) -> None:
        """Key new token positions; they are sorted in with the others when matching needs it."""
        self._tail_keys.extend(_keys_at(self._text, positions))
        self._tail_positions.extend(positions)

    def prepare(self) -> None:
        """Sort in everything added so far, as the first match after a load would (about
        0.2 s of CPU a million tokens): for a loading thread, so that no reply waits for it."""
        self._sort_tail(always=True)

    def _sort_tail(self, *, always: bool = False) -> None:
        """Merge the positions added since the last sort into the sorted keys: O(n)
        copying, done when they hold over 1/_TAIL_FRACTION of the sorted ones."""
        added = self._tail_keys.size
        if added == 0 or (not always and added <= max(_TAIL_MIN, len(self._keys) // _TAIL_FRACTION)):
            return
        order = np.argsort(self._tail_keys.view, kind="stable")
        keys = self._tail_keys.view[order]
        at = np.searchsorted(self._keys, keys, side="right")
        self._keys = np.insert(self._keys, at, keys)
        self._positions = np.insert(self._positions, at, self._tail_positions.view[order])
        self._tail_keys.replace([])
        self._tail_positions.replace([])

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
        self._sort_tail()
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
        found = [(d + 1, positions) for d, positions in enumerate(self._depth_sets(usable)) if len(positions)]
        if not found:
            return []
        nodes: list[tuple[int, np.ndarray]] = []
        for (length, positions), (_, longer) in zip(found, found[1:]):
            if len(positions) > len(longer):
                nodes.append((length, positions))
        length, positions = found[-1]
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

    def _depth_sets(self, usable: np.ndarray) -> list[np.ndarray]:
        """The positions where the history's last 1, 2 and 3 tokens occur (those it has):
        a binary search in the sorted keys, a scan of those added since."""
        depth = min(3, len(usable))
        # keys of 1, 2 and 3 tokens: token, token before, the one before that
        lows = [usable[0] << (2 * _BITS)]
        if depth > 1:
            lows.append(lows[0] | (usable[1] << _BITS))
        if depth > 2:
            lows.append(lows[1] | usable[2])
        highs = [lo + width for lo, width in zip(lows, [1 << (2 * _BITS), 1 << _BITS, 1])]
        bounds = np.searchsorted(self._keys, np.array([*lows, *highs]))
        sets = [self._positions[bounds[d]:bounds[d + depth]] for d in range(depth)]
        tail = self._tail_keys.view
        if len(tail):
            inside = np.flatnonzero((tail >= lows[0]) & (tail < highs[0]))
            for d in range(depth):
                if d:
                    inside = inside[(tail[inside] >= lows[d]) & (tail[inside] < highs[d])]
                if len(inside):
                    sets[d] = np.concatenate([sets[d], self._tail_positions.view[inside]])
        return sets

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


def _checked(tokens: Sequence[int] | np.ndarray, vocab_size: int | None = None) -> np.ndarray:
    array = np.asarray(tokens)
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        raise ValueError("a document's tokens are a flat sequence of integer token ids")
    top = MAX_TOKEN if vocab_size is None else min(vocab_size - 1, MAX_TOKEN)
    if array.size and (int(array.min()) < 0 or int(array.max()) > top):
        raise ValueError(f"token ids must lie in 0..{top}" + (" (the vocabulary)" if vocab_size is not None else ""))
    return array.astype(np.int32, copy=True)


def _keys_at(text: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The keys of token positions in `text`: the token, the one before it and the one
    before that, most significant first; a separator packs as _MASK, which no history
    token is, so no key of a document's first two tokens matches beyond its start."""
    token = text[positions].astype(np.int64)
    before = text[positions - 1].astype(np.int64)
    before2 = text[positions - 2].astype(np.int64)
    before[before == SEP] = _MASK
    before2[before2 == SEP] = _MASK
    return (token << (2 * _BITS)) | (before << _BITS) | before2


class _Growing:
    """A one-dimensional array appended to in place, its storage doubled when full."""

    def __init__(self, dtype: type, values: Sequence[int] = ()):
        self._data = np.array(values, dtype=dtype)
        self.size = len(self._data)

    @property
    def view(self) -> np.ndarray:
        return self._data[: self.size]

    def extend(self, values: np.ndarray) -> None:
        end = self.size + len(values)
        if end > len(self._data):
            grown = np.empty(max(end, 2 * len(self._data), 64), dtype=self._data.dtype)
            grown[: self.size] = self.view
            self._data = grown
        self._data[self.size:end] = values
        self.size = end

    def replace(self, values: Sequence[int] | np.ndarray) -> None:
        self._data = np.array(values, dtype=self._data.dtype)
        self.size = len(self._data)
