"""The message input: multi-line, Enter sends, Shift+Enter or Ctrl+J adds a line,
Up/Down on the first/last row walk through what was sent before; `@path`
completes a file's path with Tab, and a pasted path of a file attaches it."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Callable
from urllib.parse import unquote, urlsplit

from textual import events
from textual.message import Message

from edgespec.tui.widgets.long_text import LongTextArea


_AT_WORD = re.compile(r"(?:^|\s)@([^\s@]*)$")


def dropped_path(line: str) -> str:
    """`line` as the path a terminal pastes for a file dragged into it: quoted
    (`'my notes.txt'`), its spaces escaped (`my\\ notes.txt`) or a file:// URI, each
    one path; any other line as it is (a path with bare spaces, or only text)."""
    if line.startswith("file://"):
        parts = urlsplit(line)
        return unquote(parts.path) if parts.netloc in ("", "localhost") else line
    if not any(ch in line for ch in "'\"\\"):
        return line
    try:
        words = shlex.split(line)
    except ValueError:  # an unmatched quote: text
        return line
    return words[0] if len(words) == 1 else line


class PromptInput(LongTextArea):
    """Where the user writes."""

    @dataclass
    class Submitted(Message):
        """The user pressed Enter."""

        text: str
        """What was written, without the blank around it (empty: nothing was; the screen
        says so where files are attached)."""

    @dataclass
    class CompletionChosen(Message):
        """Tab while completions of an `@path` are shown: take the highlighted one."""

    def __init__(self, **kwargs) -> None:
        super().__init__(soft_wrap=True, show_line_numbers=False, tab_behavior="focus", **kwargs)
        self.sent: list[str] = []
        self._history_pos: int | None = None
        self._draft = ""
        self.completing = False
        """Whether completions of an `@path` are shown (the screen sets it): Tab takes one."""
        self.attach_path: Callable[[str], bool] | None = None
        """Given a pasted line, attaches the file it names and says so (the screen sets it)."""

    def at_word(self) -> tuple[str, int] | None:
        """The `@path` being typed at the cursor: the path so far and the column of its `@`."""
        row, column = self.cursor_location
        match = _AT_WORD.search(self.document.get_line(row)[:column])
        return (match.group(1), column - len(match.group(1)) - 1) if match else None

    async def _on_paste(self, event: events.Paste) -> None:
        """A path of a file attaches it; other text goes on to TextArea's own handler (Textual calls it next)."""
        line = event.text.strip()
        if (self.attach_path is not None and line and "\n" not in line
                and (self.attach_path(line) or dropped_path(line) != line and self.attach_path(dropped_path(line)))):
            event.stop()
            event.prevent_default()

    async def _on_key(self, event) -> None:
        if event.key == "tab" and self.completing:
            event.stop()
            event.prevent_default()
            self.post_message(self.CompletionChosen())
            return
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self.post_message(self.Submitted(self.text.strip()))
            return
        # the top and bottom rows as shown: in a paragraph that wraps, Up and Down move the cursor
        if event.key == "up" and self.navigator.is_first_wrapped_line(self.cursor_location) and self._walk(-1):
            event.stop()
            event.prevent_default()
            return
        if event.key == "down" and self.navigator.is_last_wrapped_line(self.cursor_location) and self._walk(1):
            event.stop()
            event.prevent_default()
            return
        await super()._on_key(event)

    def typed_text(self, event) -> str | None:
        """Shift+Enter and Ctrl+J write a new line (a paste that arrives as keys sends Ctrl+J)."""
        return "\n" if event.key in ("shift+enter", "ctrl+j") else super().typed_text(event)

    def remember(self, text: str) -> None:
        """Add a sent message to the history and clear the input."""
        if not self.sent or self.sent[-1] != text:
            self.sent.append(text)
        self._history_pos = None
        self.clear()

    def _walk(self, step: int) -> bool:
        if not self.sent:
            return False
        if self._history_pos is None:
            if step > 0:
                return False
            self._draft = self.text
            pos = len(self.sent) - 1
        else:
            pos = self._history_pos + step
        if pos < 0:
            return True
        if pos >= len(self.sent):
            self._history_pos = None
            self.load_text(self._draft)
        else:
            self._history_pos = pos
            self.load_text(self.sent[pos])
        self.move_cursor(self.document.end)
        return True
