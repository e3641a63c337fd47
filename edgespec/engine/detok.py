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


class _StopTrie:
    """The stop strings as an Aho-Corasick automaton, built as the text reaches it.

    A node is a prefix of a stop string: the run of the sorted stop strings that begin
    with it. A step goes to the longest end of the text so far that is a node, so no
    text is read twice, and a node's child, failure link and longest stop string ending
    there are each found once, when first needed: a long stop string costs only as much
    of it as the text matches, and many of them cost only the nodes the text reaches."""

    def __init__(self, stops: Sequence[str]):
        self._sorted = sorted(set(stops))
        # One entry a node; the root is node 0, the empty prefix of every stop string.
        self._depth, self._parent, self._char = [0], [0], [""]
        self._runs = [(0, len(self._sorted))]
        self._fails, self._ends = [0], [0]  # -1: not found yet
        self._kids: dict[tuple[int, str], int] = {}  # (node, char) -> child (0: none)

    def depth(self, node: int) -> int:
        return self._depth[node]

    def step(self, node: int, char: str) -> int:
        """The node for the text so far, `node`, followed by `char`."""
        while not (kid := self._child(node, char)) and node:
            node = self._fail(node)
        return kid

    def _child(self, node: int, char: str) -> int:
        kid = self._kids.get((node, char))
        if kid is None:
            kid = self._kids[node, char] = self._find_child(node, char)
        return kid

    def _find_child(self, node: int, char: str) -> int:
        """The run of the node's stop strings whose next character is `char`: they are
        sorted by it, as they share all that comes before."""
        depth, (lo, hi) = self._depth[node], self._runs[node]

        def key(stop: str) -> str:
            return stop[depth:depth + 1]

        first = bisect.bisect_left(self._sorted, char, lo, hi, key=key)
        after = bisect.bisect_right(self._sorted, char, first, hi, key=key)
        if first == after:
            return 0
        self._depth.append(depth + 1)
        self._parent.append(node)
        self._char.append(char)
        self._runs.append((first, after))
        self._fails.append(-1 if node else 0)  # a first character's link is the root
        self._ends.append(-1)
        return len(self._depth) - 1

    def _fail(self, node: int) -> int:
        """The node's failure link: its longest proper end that is a node, the step from
        its parent's link along its last character. Links it needs that are not found yet
        are found first, from a stack rather than recursion: they can be as many as the
        longest stop string is long. `resume`: where a search waiting on one had got to."""
        todo, resume = [node], {}
        while todo:
            n = todo[-1]
            at = resume.pop(n, self._fails[self._parent[n]])
            if self._fails[n] >= 0:
                todo.pop()
            elif at < 0:
                todo.append(self._parent[n])
            else:
                while not (kid := self._child(at, self._char[n])) and at and self._fails[at] >= 0:
                    at = self._fails[at]
                if kid or not at:
                    self._fails[n] = kid
                    todo.pop()
                else:
                    resume[n] = at
                    todo.append(at)
        return self._fails[node]

    def ends(self, node: int) -> int:
        """The length of the longest stop string the node's prefix ends with (0: none):
        its own if it is one, else its failure link's."""
        chain = []
        while self._ends[node] < 0:
            if len(self._sorted[self._runs[node][0]]) == self._depth[node]:
                self._ends[node] = self._depth[node]
            else:
                chain.append(node)
                node = self._fail(node)
        for n in chain:
            self._ends[n] = self._ends[node]
        return self._ends[node]


class StopStrings:
    """Finds stop strings in streamed text; holds back a tail that may start one.

    The pending text is the longest tail of the text that begins a stop string, with the
    newest text after it; each new character takes one step of the automaton, which
    tells the tail held back and the longest stop string ending there. What a token
    costs grows with its characters, not with the stop strings' number or length."""

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self._trie = _StopTrie(self.stops)
        self._node = 0
        self._pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """Text safe to show now, and whether a stop string was found (text ends before it)."""
        cut = self._first_stop(text)
        self._pending += text
        if cut >= 0:
            out, self._pending, self._node = self._pending[:cut], "", 0
            return out, True
        split = len(self._pending) - self._trie.depth(self._node)
        out, self._pending = self._pending[:split], self._pending[split:]
        return out, False

    def _first_stop(self, text: str) -> int:
        """Where the earliest stop string ending in `text` begins in the pending text
        and `text` (-1: none): at each end, the longest one ending there begins first."""
        first = -1
        for end, char in enumerate(text, len(self._pending) + 1):
            self._node = self._trie.step(self._node, char)
            length = self._trie.ends(self._node)
            if length and (first < 0 or end - length < first):
                first = end - length
        return first

    def flush(self) -> str:
        out, self._pending, self._node = self._pending, "", 0
        return out
