"""A text area that stays responsive with text of any size: a whole pasted file,
one enormous line, or a paste that arrives as thousands of keystrokes (a
terminal without bracketed paste, `tmux paste-buffer` without `-p`)."""

from __future__ import annotations

from dataclasses import dataclass

from textual import events
from textual.widgets import TextArea

from edgespec.errors import terminal_text

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


@dataclass
class TextShape:
    """What soft wrapping depends on: the characters of the text (a newline counts
    one) and how many of its lines are longer than WRAP_MAX_LINE."""

    chars: int = 0
    long_lines: int = 0

    @property
    def wraps(self) -> bool:
        """Soft wrap text of this shape? (WRAP_MAX_LINE, WRAP_MAX_CHARS)"""
        return self.long_lines == 0 and self.chars <= WRAP_MAX_CHARS


def measure(lines: list[str]) -> TextShape:
    """The shape of `lines`; it reads each line's length only."""
    return TextShape(sum(len(line) + 1 for line in lines), sum(len(line) > WRAP_MAX_LINE for line in lines))


def should_wrap(lines: list[str]) -> bool:
    """Soft wrap for this text? (WRAP_MAX_LINE, WRAP_MAX_CHARS)"""
    return measure(lines).wraps


class LongTextArea(TextArea):
    """A TextArea that soft-wraps only while that is cheap, and whose cost per key
    does not grow with its text.

    The text's shape (`TextShape`) is kept edit by edit from the lines each edit
    replaced and wrote, never by reading the whole text again. Characters typed in
    a burst are inserted as one edit: a key only adds its character to `_typed`,
    and that is inserted when the keys already queued have been read (or before
    any other event, so that an arrow key or a click comes after what was typed
    before it). A human's keys each arrive alone and show at once."""

    def __init__(self, text: str = "", *args, **kwargs) -> None:
        super().__init__(terminal_text(text), *args, **kwargs)
        self._shape = measure(self.document.lines)
        self._typed: list[str] = []

    def on_mount(self) -> None:
        self._fit_wrap()

    # -- keys ---------------------------------------------------------------------
    async def on_event(self, event: events.Event) -> None:
        if self._typed and not self._is_typed(event):
            self.flush_typed()
        await super().on_event(event)

    async def _on_key(self, event: events.Key) -> None:
        if self._is_typed(event):
            event.stop()
            event.prevent_default()
            self._restart_blink()  # as TextArea does for a key it inserts: the cursor shows while typing
            if not self._typed:
                self.call_later(self.flush_typed)
            self._typed.append(self.typed_text(event))
            return
        await super()._on_key(event)

    def typed_text(self, event: events.Key) -> str | None:
        """What the key `event` writes into the text (None: it writes nothing)."""
        return event.character if event.is_printable else None

    def typing_only(self, event: events.Key) -> bool:
        """Whether the key `event` only writes into this text: it writes a character that
        this text area takes (Textual then lets no binding above it have the key) and no
        binding of its own has it."""
        return (self.check_consume_key(event.key, event.character) and self._is_typed(event)
                and not self._bindings.key_to_bindings.get(event.key))

    def _is_typed(self, event: events.Event) -> bool:
        return isinstance(event, events.Key) and not self.read_only and self.typed_text(event) is not None

    def flush_typed(self) -> None:
        """Insert the characters typed and not inserted yet, in one edit."""
        if self._typed:
            text, self._typed = "".join(self._typed), []
            start, end = self.selection
            self.replace(text, start, end, maintain_selection_offset=False)

    # -- the text's shape ---------------------------------------------------------
    def edit(self, edit):
        # What a terminal would act on (a pasted log's escapes) is left out: drawn, it would act.
        edit.text = terminal_text(edit.text)
        top, bottom = sorted((edit.from_location, edit.to_location))
        before = measure(self.document.lines[top[0]:bottom[0] + 1])
        result = super().edit(edit)
        after = measure(self.document.lines[top[0]:result.end_location[0] + 1])
        self._shape = TextShape(self._shape.chars - before.chars + after.chars,
                                self._shape.long_lines - before.long_lines + after.long_lines)
        self._fit_wrap()
        return result

    def undo(self) -> None:
        super().undo()
        self._remeasure()

    def redo(self) -> None:
        super().redo()
        self._remeasure()

    def load_text(self, text: str) -> None:
        self._typed = []
        super().load_text(terminal_text(text))
        self._remeasure()

    def _remeasure(self) -> None:
        self._shape = measure(self.document.lines)
        self._fit_wrap()

    def _fit_wrap(self) -> None:
        if self._shape.wraps != self.soft_wrap:
            self.soft_wrap = self._shape.wraps
