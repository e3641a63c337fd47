"""Prompt tokens that extend what the engine's KV caches already hold.

`Engine.generate` reuses the longest common prefix of its caches and the new
prompt. A reply is cached as the tokens the model produced, which need not be
the tokens its text would tokenize to; so when a new prompt starts with the
text of the previous prompt and reply, those exact tokens are kept and only the
new text is tokenized. Anything else is tokenized afresh (the engine still
reuses whatever common prefix there is).
"""

from __future__ import annotations

from typing import Sequence

from edgespec.engine.protocol import ChatEngine


REMEMBERED = 16
"""Conversations whose last prompt and reply are remembered (the engine's caches
hold several, and snapshots of more)."""


class PrefixTokenizer:
    """Tokenizes prompts for one engine, remembering the latest prompts and replies."""

    def __init__(self, engine: ChatEngine):
        self.engine = engine
        self._cached: list[tuple[str, list[int]]] = []
        """Text and tokens of recent prompts with their replies, as the engine's caches
        hold them; the most recent last."""

    def tokenize(self, text: str, *, add_bos: bool) -> list[int]:
        """The tokens of `text` (special texts parsed); `add_bos` applies only
        when nothing cached is reused."""
        found = max((c for c in self._cached if text.startswith(c[0])), key=lambda c: len(c[0]), default=None)
        if found:
            cached_text, cached_tokens = found
            return cached_tokens + self.engine.tokenize(text[len(cached_text):], add_bos=False, special=True)
        return self.engine.tokenize(text, add_bos=add_bos, special=True)

    def remember(self, prompt_text: str, prompt_tokens: Sequence[int], reply_text: str,
                 reply_tokens: Sequence[int]) -> None:
        """Keep the prompt and reply tokens for a later prompt, if they spell the reply
        exactly (the end-of-generation token that closed it is not part of the text).
        What they extend is forgotten: the longer one serves both."""
        for n in (len(reply_tokens), len(reply_tokens) - 1):
            if n >= 0 and self.engine.detokenize(reply_tokens[:n]) == reply_text:
                text = prompt_text + reply_text
                self._cached = [c for c in self._cached if not text.startswith(c[0])][-(REMEMBERED - 1):]
                self._cached.append((text, [*prompt_tokens, *reply_tokens[:n]]))
                return
