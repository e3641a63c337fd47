"""A text area that stays responsive with text of any size: a whole pasted file,
or one enormous line."""

from __future__ import annotations

from textual.widgets import TextArea

WRAP_MAX_LINE = 1_000
"""Soft wrap only while every line has at most this many characters. Textual's
TextArea renders a wrapped line whole for each screen row it shows, so a redraw
costs the rows shown times the line's length: one pasted line of 50,000
characters at a narrow width took seconds a redraw, and keys and resizes queued
behind them. Longer lines scroll sideways instead (a redraw is then linear in
the line). The chat column is at least 24 columns wide (app.tcss), so a wrapped
line takes at most about 50 rows of the prompt."""

WRAP_MAX_CHARS = 100_000
"""...and while the whole text has at most this many characters: every change of
width wraps all of it again (a megabyte took 3-4 s a resize)."""


def should_wrap(lines: list[str]) -> bool:
    """Soft wrap for this text? (WRAP_MAX_LINE, WRAP_MAX_CHARS)"""
    total = 0
    for line in lines:
        if len(line) > WRAP_MAX_LINE:
            return False
        total += len(line) + 1
        if total > WRAP_MAX_CHARS:
            return False
    return True


class LongTextArea(TextArea):
    """A TextArea that soft-wraps only while that is cheap (`should_wrap`)."""

    def on_mount(self) -> None:
        self._fit_wrap()

    def edit(self, edit):
        result = super().edit(edit)
        self._fit_wrap()
        return result

    def load_text(self, text: str) -> None:
        super().load_text(text)
        self._fit_wrap()

    def _fit_wrap(self) -> None:
        wrap = should_wrap(self.document.lines)
        if wrap != self.soft_wrap:
            self.soft_wrap = wrap
