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
class Tokenized:
    """A prompt's tokens, the stretches its text was laid out in, and where each content's tokens are."""

    tokens: list[int]
    stretches: tuple[Stretch, ...]
    contents: dict[tuple[int, int], tuple[int, int]]
    """Each content stretch's characters [start, end) -> its tokens [start, end). A token
    that holds the template's text and the start or end of a content counts as the content's."""


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
            tokens, contents, offset = self.engine.tokenize("", add_bos=True) if add_bos else [], {}, 0
        else:
            tokens, contents, offset = list(found[1].tokens), dict(found[1].contents), len(found[0])
        if raw:
            return Tokenized(tokens + self.engine.tokenize(text[offset:], special=True), stretches, contents)
        marks = [m for s in stretches if s.special and s.end > offset
                 for m in self._markers(text, max(s.start, offset), s.end)]
        ends = [offset, *(p for m in marks for p in m), len(text)]
        for start, end, is_mark in zip(ends, ends[1:], [False, True] * len(marks) + [False]):
            run = self._tokens(text[start:end], special=is_mark)
            if not is_mark:
                contents.update(self._contents(text, start, end, run, len(tokens), stretches))
            tokens += run
        return Tokenized(tokens, stretches, contents)

    def remember(self, prompt_text: str, prompt: Tokenized, reply_text: str, reply_tokens: Sequence[int]) -> None:
        """Keep the prompt and reply tokens for a later prompt, if they spell the reply
        exactly (the end-of-generation token that closed it is not part of the text).
        The reply is a content: a later prompt reuses it where it places the reply as
        its content. What this extends is forgotten: the longer one serves both."""
        for n in (len(reply_tokens), len(reply_tokens) - 1):
            if n >= 0 and self.engine.detokenize(reply_tokens[:n]) == reply_text:
                text = prompt_text + reply_text
                reply = (len(prompt_text), len(text))
                tokenized = Tokenized([*prompt.tokens, *reply_tokens[:n]],
                                      (*prompt.stretches, Stretch(*reply, special=False)),
                                      {**prompt.contents, reply: (len(prompt.tokens), len(prompt.tokens) + n)})
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

    def _contents(self, text: str, start: int, end: int, run: list[int], first: int,
                  stretches: Sequence[Stretch]) -> dict[tuple[int, int], tuple[int, int]]:
        """The tokens of each content inside the run text[start:end], which became `run`
        (its first token at `first`): those the text before it does not fill, and
        the text after it does not."""
        found = {}
        for s in stretches:
            if not s.special and start <= s.start and s.end <= end:
                before = self._tokens(text[start:s.start], special=False)
                after = self._tokens(text[s.end:end], special=False)
                head = _common(before, run)
                tail = _common(after[::-1], run[::-1])
                found[(s.start, s.end)] = (first + head, first + max(head, len(run) - tail))
        return found


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the common prefix of `a` and `b`."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n
