"""Prompt tokens that extend what the engine's KV caches already hold.

`Engine.generate` reuses the longest common prefix of its caches and the new
prompt. A reply is cached as the tokens the model produced, which need not be
the tokens its text would tokenize to; so when a new prompt starts with the
text of the previous prompt and reply, laid out in the same stretches, those
exact tokens are kept and only the new text is tokenized. Anything else is
tokenized afresh (the engine still reuses whatever common prefix there is).

A chat prompt is laid out in stretches: the template's own text and each
message's content. Only the special texts of the template's stretches become
control tokens (its markers); everything between two markers, template text
and contents alike, is tokenized as plain text. That is how llama.cpp cuts a
text with special parsing on (at each special text, then each part alone), so
a conversation whose contents hold no special text gets the tokens of its
whole text; one whose contents do gets those texts as text.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from typing import Sequence

from edgespec.engine.protocol import ChatEngine


REMEMBERED = 16
"""Conversations whose last prompt and reply are remembered (the engine's caches
hold several, and snapshots of more)."""
SHORT, SHORT_KEPT = 256, 1024
"""Texts of up to SHORT characters have their tokens kept, up to SHORT_KEPT of them."""


@dataclass(frozen=True)
class Stretch:
    """Characters [start, end) of a prompt's text: the template's own, or a content."""

    start: int
    end: int
    special: bool
    """Whether special texts in it become control tokens (the template's text) or stay text (a content)."""


@dataclass(frozen=True)
class Run:
    """Characters [start, end) of a prompt's text that were tokenized alone, and their tokens [first, last)."""

    start: int
    end: int
    first: int
    last: int


@dataclass(frozen=True)
class Tokenized:
    """A prompt's tokens, the stretches its text was laid out in, and the runs it was tokenized in."""

    tokens: list[int]
    stretches: tuple[Stretch, ...]
    runs: tuple[Run, ...] = ()
    """In order, covering the text: a marker, the text between two markers, a remembered reply."""


class PrefixTokenizer:
    """Tokenizes prompts for one engine, remembering the latest prompts and replies."""

    def __init__(self, engine: ChatEngine):
        self.engine = engine
        self._cached: list[tuple[str, Tokenized]] = []
        """Recent prompts with their replies, as the engine's caches hold them; the most recent last."""
        self._control: dict[int, bool] = {}
        """Whether a token is a control token (its text is special only when special texts are parsed)."""
        self._short: dict[tuple[str, bool], list[int]] = {}
        """Tokens of short texts (the template's, between and around contents), which every turn repeats."""

    def tokenize(self, text: str, stretches: Sequence[Stretch] | None = None, *, add_bos: bool) -> Tokenized:
        """`text`, laid out in `stretches` (contiguous, covering it); None: all of it is
        the template's, as a raw prompt, which reuses any remembered prefix of it.
        `add_bos` applies only when nothing remembered is reused."""
        raw = stretches is None
        stretches = (Stretch(0, len(text), special=True),) if raw else tuple(stretches)
        found = max(((t, c) for t, c in self._cached
                     if text.startswith(t) and (raw or stretches[:len(c.stretches)] == c.stretches)),
                    key=lambda found: len(found[0]), default=None)
        if found is None:
            tokens, runs, offset = self.engine.tokenize("", add_bos=True) if add_bos else [], [], 0
        else:
            tokens, runs, offset = list(found[1].tokens), list(found[1].runs), len(found[0])
        if raw:
            rest = self.engine.tokenize(text[offset:], special=True)
            run = Run(offset, len(text), len(tokens), len(tokens) + len(rest))
            return Tokenized(tokens + rest, stretches, (*runs, run))
        marks = [m for s in stretches if s.special and s.end > offset
                 for m in self._markers(text, max(s.start, offset), s.end)]
        ends = [offset, *(p for m in marks for p in m), len(text)]
        for start, end, is_mark in zip(ends, ends[1:], [False, True] * len(marks) + [False]):
            if end > start:
                run = self._tokens(text[start:end], special=is_mark)
                runs.append(Run(start, end, len(tokens), len(tokens) + len(run)))
                tokens += run
        return Tokenized(tokens, stretches, tuple(runs))

    def tokens_of(self, text: str, tokenized: Tokenized, start: int, end: int) -> tuple[int, int]:
        """The tokens [first, last) that hold characters [start, end) of `text`, tokenized
        as `tokenized`. A token holding characters on both sides of an edge counts as
        inside: those before `start` do not fill it, nor those after `end`."""
        first = self._edge(text, tokenized, start, at_start=True)
        if end <= start:
            return first, first
        return first, max(first, self._edge(text, tokenized, end, at_start=False))

    def remember(self, prompt_text: str, prompt: Tokenized, reply_text: str, reply_tokens: Sequence[int]) -> None:
        """Keep the prompt and reply tokens for a later prompt, if they spell the reply
        exactly (the end-of-generation token that closed it is not part of the text).
        The reply is a content: a later prompt reuses it where it places the reply as
        its content. What this extends is forgotten: the longer one serves both."""
        for n in (len(reply_tokens), len(reply_tokens) - 1):
            if n >= 0 and self.engine.detokenize(reply_tokens[:n]) == reply_text:
                text = prompt_text + reply_text
                reply = Run(len(prompt_text), len(text), len(prompt.tokens), len(prompt.tokens) + n)
                tokenized = Tokenized([*prompt.tokens, *reply_tokens[:n]],
                                      (*prompt.stretches, Stretch(reply.start, reply.end, special=False)),
                                      (*prompt.runs, reply) if reply_text else prompt.runs)
                self._cached = [c for c in self._cached if not text.startswith(c[0])][-(REMEMBERED - 1):]
                self._cached.append((text, tokenized))
                return

    def _tokens(self, text: str, *, special: bool) -> list[int]:
        if len(text) > SHORT:
            return self.engine.tokenize(text, special=special)
        if (text, special) not in self._short:
            if len(self._short) >= SHORT_KEPT:
                self._short.clear()
            self._short[text, special] = self.engine.tokenize(text, special=special)
        return self._short[text, special]

    def _markers(self, text: str, start: int, end: int) -> list[tuple[int, int]]:
        """Where the control tokens' texts are in text[start:end] (the template's), in order."""
        part = text[start:end]
        controls = [t for t in set(self._tokens(part, special=True)) if self._is_control(t)]
        found = {self.engine.token_text(t) for t in controls}
        if not found:
            return []
        pattern = re.compile("|".join(re.escape(s) for s in sorted(found, key=len, reverse=True)))
        return [(start + m.start(), start + m.end()) for m in pattern.finditer(part)]

    def _is_control(self, token: int) -> bool:
        if token not in self._control:
            piece = self.engine.token_text(token)
            self._control[token] = (self.engine.tokenize(piece, special=True)
                                    != self.engine.tokenize(piece, special=False))
        return self._control[token]

    def _edge(self, text: str, tokenized: Tokenized, pos: int, *, at_start: bool) -> int:
        """The token where a span starting (or ending) at character `pos` starts (or ends)."""
        # Runs are in order: a search, since a prompt's every content asks (a scan was quadratic in messages).
        runs = tokenized.runs
        if at_start:
            i = bisect.bisect_right(runs, pos, key=lambda r: r.start) - 1
            run = runs[i] if i >= 0 and runs[i].start <= pos < runs[i].end else None
        else:
            i = bisect.bisect_left(runs, pos, key=lambda r: r.end)
            run = runs[i] if i < len(runs) and runs[i].start < pos <= runs[i].end else None
        if run is None:  # before the first run (BOS) or after the last
            return len(tokenized.tokens) if pos > 0 else (tokenized.runs[0].first if tokenized.runs else 0)
        if pos == (run.start if at_start else run.end):
            return run.first if at_start else run.last
        tokens = tokenized.tokens[run.first:run.last]
        if at_start:
            return run.first + _common(self._tokens(text[run.start:pos], special=False), tokens)
        return run.last - _common(self._tokens(text[pos:run.end], special=False)[::-1], tokens[::-1])


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the common prefix of `a` and `b`."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n
