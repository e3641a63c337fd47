"""Which tokens of a reply came from the drafter: text spans for the coloured view.

A speculative cycle yields the draft tokens the target accepted, then one token
of the target's own. `spans` merges per-token pieces into runs of one origin.
"""

from __future__ import annotations

from rich.text import Text

from edgespec.errors import terminal_text

DRAFT_STYLE = "#e8f5e9 on #2e6b3a"
"""Accepted draft tokens."""
TARGET_STYLE = ""
"""Tokens the target produced itself."""


def spans(pieces: list[str], from_draft: list[bool]) -> list[tuple[str, bool]]:
    """Merge per-token `pieces` into `(text, from_draft)` runs."""
    runs: list[tuple[str, bool]] = []
    for piece, drafted in zip(pieces, from_draft):
        if runs and runs[-1][1] == drafted:
            runs[-1] = (runs[-1][0] + piece, drafted)
        elif piece:
            runs.append((piece, drafted))
    return runs


def chunk_spans(engine, text: str, tokens: list[int], from_draft: list[bool]) -> list[tuple[str, bool]]:
    """Runs for one chunk; when the token pieces don't add up to the chunk's text
    (a character split across tokens), the whole chunk takes its tokens' majority origin."""
    if tokens and len(tokens) == len(from_draft):
        pieces = [engine.token_text(t) for t in tokens]
        if "".join(pieces) == text:
            return spans(pieces, from_draft)
    if not text:
        return []
    return [(text, sum(from_draft) * 2 > len(from_draft))]


def stored_spans(engine, content: str, from_draft: list[bool] | None) -> list[tuple[str, bool]]:
    """Runs for a stored reply, re-tokenized; all-target when the tokens don't line up."""
    if from_draft and engine is not None:
        tokens = engine.tokenize(content, add_bos=False, special=False)
        if len(tokens) == len(from_draft):
            pieces = [engine.token_text(t) for t in tokens]
            if "".join(pieces) == content:
                return spans(pieces, from_draft)
    return [(content, False)] if content else []


def render(runs: list[tuple[str, bool]]) -> Text:
    """The runs as Rich text: draft tokens highlighted, target tokens plain."""
    text = Text()
    for piece, drafted in runs:
        text.append(terminal_text(piece), style=DRAFT_STYLE if drafted else TARGET_STYLE)
    return text
