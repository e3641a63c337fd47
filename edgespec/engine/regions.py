"""Labelled token spans of a prompt (a system prompt, an attached file, earlier
turns), so that a drafter can say where the tokens it proposed came from.

The chat layer labels them (chat/prompt.py: Prompt.regions); the engine keeps the
labels as data and only looks positions up in them.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Region:
    """Tokens [start, end) of a prompt that hold one labelled part of it."""

    start: int
    end: int
    label: str
    """What the part is, as the layer that made the prompt names it ("system", "user:3",
    "file:src/app.py"): a source's name, never words for people."""


PROMPT = "prompt"
"""Where a position of the prompt lies outside every region (a template's markers, a raw prompt)."""
REPLY = "reply"
"""Where a position past the prompt lies: the reply being generated."""


class Regions:
    """One reply's prompt regions, looked up by position."""

    def __init__(self, n_prompt: int = 0, regions: Sequence[Region] = ()):
        self.n_prompt = n_prompt
        self._regions = sorted((r for r in regions if r.start < r.end), key=lambda r: r.start)
        self._starts = [r.start for r in self._regions]

    def label_at(self, position: int) -> str:
        """The label of the region that holds token `position` of the history: the
        innermost labelled region (a file's span inside its message), else PROMPT in
        the prompt and REPLY past it."""
        if position >= self.n_prompt:
            return REPLY
        i = bisect.bisect_right(self._starts, position)
        # Of the regions that start at or before it, the last one holding it is the innermost.
        for j in range(i - 1, -1, -1):
            if position < self._regions[j].end:
                return self._regions[j].label
        return PROMPT
