"""Tokens to text while streaming: whole UTF-8 characters only, stop strings cut."""

from __future__ import annotations

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
    """Finds stop strings in streamed text; holds back a tail that may start one."""

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self._pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """Text safe to show now, and whether a stop string was found (text ends before it)."""
        self._pending += text
        cut = min((i for i in (self._pending.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            out, self._pending = self._pending[:cut], ""
            return out, True
        split = len(self._pending) - self._partial_stop_length()
        out, self._pending = self._pending[:split], self._pending[split:]
        return out, False

    def _partial_stop_length(self) -> int:
        """Length of the longest tail of the pending text that begins a stop string."""
        longest = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(self._pending)), longest, -1):
                if self._pending.endswith(stop[:n]):
                    longest = n
                    break
        return longest

    def flush(self) -> str:
        out, self._pending = self._pending, ""
        return out
