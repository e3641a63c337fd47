"""Small modal dialogs: confirm, and ask for a line (or a few lines) of text."""

from __future__ import annotations

from rich.text import Text
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label

from edgespec.errors import terminal_text
from edgespec.tui.widgets.long_text import LongTextArea


class ConfirmScreen(ModalScreen[bool]):
    """Yes or no; Esc is no."""

    BINDINGS = [Binding("escape", "dismiss(False)", "Cancel")]

    def __init__(self, question: str, *, yes: str = "Yes") -> None:
        super().__init__(classes="dialog")
        self.question = question
        self.yes = yes

    def compose(self):
        with Vertical(classes="dialog-box"):
            # words, not markup: a question may name a path like [slug].tsx, and a name may hold
            # what a terminal would act on
            yield Label(Text(terminal_text(self.question)))
            with Horizontal(classes="buttons"):
                yield Button(self.yes, variant="error", id="yes")
                yield Button("Cancel", id="no")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")


class TextPromptScreen(ModalScreen[str | None]):
    """Ask for text; None when cancelled. `multiline` uses a text area (Ctrl+S saves)."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel"), Binding("ctrl+s", "save", "Save", priority=True)]

    def __init__(self, title: str, value: str = "", *, multiline: bool = False, ok: str = "OK") -> None:
        super().__init__(classes="dialog")
        self.title_text = title
        self.value = value
        self.multiline = multiline
        self.ok = ok

    def compose(self):
        with Vertical(classes="dialog-box"):
            yield Label(self.title_text)
            if self.multiline:
                yield LongTextArea(self.value, id="value", soft_wrap=True)
            else:
                yield Input(self.value, id="value")
            with Horizontal(classes="buttons"):
                yield Button(self.ok, variant="primary", id="ok")
                yield Button("Cancel", id="cancel")

    def _value(self) -> str:
        widget = self.query_one("#value")
        return widget.text if self.multiline else widget.value

    def action_save(self) -> None:
        text = self._value().strip()
        self.dismiss(text or None)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.action_save()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "ok":
            self.action_save()
        else:
            self.dismiss(None)
