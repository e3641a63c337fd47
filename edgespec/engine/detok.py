"""Tokens to text while streaming: whole UTF-8 characters only, stop strings cut."""

from __future__ import annotations

import bisect
import codecs
from typing import Callable, Sequence


class Detokenizer:
    """Turns token pieces into text; a character split across tokens waits until complete."""

    def __init__(self, piece: Callable[[int], bytes]):
        self._piece = piece
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, tokens: Sequence[int]) -> str:
        return self._decoder.decode(b"".join(self._piece(t) for t in tokens))

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)


class StopStrings:
    """Finds stop strings in streamed text; holds back a tail that may start one.

    The pending text never holds a whole stop string, so one found must end in the
    newest text: each of its ends is looked up in a set, once for each length the stop
    strings have, and the held-back tail in the sorted stop strings. What a token costs
    grows with the different lengths of the stop strings, not with their number."""

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self._set = frozenset(self.stops)
        self._sorted = sorted(self._set)
        self._lengths = sorted({len(s) for s in self._set})
        self._pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """Text safe to show now, and whether a stop string was found (text ends before it)."""
        new = len(self._pending)
        self._pending += text
        cut = self._first_stop(new)
        if cut >= 0:
            out, self._pending = self._pending[:cut], ""
            return out, True
        split = len(self._pending) - self._partial_stop_length()
        out, self._pending = self._pending[:split], self._pending[split:]
        return out, False

    def _first_stop(self, new: int) -> int:
        """Where the earliest stop string in the pending text begins (-1: none), each ending past `new`."""
        pending, first = self._pending, -1
        for end in range(new + 1, len(pending) + 1):
            for n in self._lengths:
                if n > end:
                    break
                if (first < 0 or end - n < first) and pending[end - n:end] in self._set:
                    first = end - n
        return first

    def _partial_stop_length(self) -> int:
        """Length of the longest tail of the pending text that begins a stop string: the
        first stop string sorted at or after a tail begins with it if any does."""
        longest = self._lengths[-1] - 1 if self._lengths else 0
        for n in range(min(longest, len(self._pending)), 0, -1):
            tail = self._pending[-n:]
            i = bisect.bisect_left(self._sorted, tail)
            if i < len(self._sorted) and self._sorted[i].startswith(tail):
                return n
        return 0

    def flush(self) -> str:
        out, self._pending = self._pending, ""
        return out
