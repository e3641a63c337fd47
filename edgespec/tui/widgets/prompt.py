"""The message input: multi-line, Enter sends, Shift+Enter or Ctrl+J adds a line,
Up/Down on the first/last line walk through what was sent before."""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from edgespec.tui.widgets.long_text import LongTextArea


class PromptInput(LongTextArea):
    """Where the user writes."""

    @dataclass
    class Submitted(Message):
        """The user pressed Enter."""

        text: str

    def __init__(self, **kwargs) -> None:
        super().__init__(soft_wrap=True, show_line_numbers=False, tab_behavior="focus", **kwargs)
        self.sent: list[str] = []
        self._history_pos: int | None = None
        self._draft = ""

    async def _on_key(self, event) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            text = self.text.strip()
            if text:
                self.post_message(self.Submitted(text))
            return
        if event.key == "up" and self.cursor_location[0] == 0 and self._walk(-1):
            event.stop()
            event.prevent_default()
            return
        if event.key == "down" and self.cursor_location[0] == self.document.line_count - 1 and self._walk(1):
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
