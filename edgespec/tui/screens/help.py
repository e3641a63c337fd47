"""The help screen: every key binding, from the bindings themselves."""

from __future__ import annotations

from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

INPUT_KEYS = [
    ("enter", "Send the message"),
    ("shift+enter, ctrl+j", "New line in the message"),
    ("up / down", "Previous / next sent message (on the first / last line)"),
    ("tab / shift+tab", "Move focus (focus a message to copy, edit or regenerate it)"),
]


def bindings_table(bindings: list[Binding]) -> str:
    """A Markdown table of the app's bindings that have a description."""
    rows = [f"| `{key}` | {text} |" for key, text in INPUT_KEYS]
    for binding in bindings:
        if binding.description:
            key = binding.key.replace("question_mark", "?").replace(",", " / ")
            rows.append(f"| `{key}` | {binding.description} |")
    return "\n".join(["| Key | Action |", "|---|---|", *rows])


class HelpScreen(ModalScreen[None]):
    """Key bindings; Esc, F1 or q closes it."""

    BINDINGS = [Binding("escape,f1,q,question_mark", "dismiss", "Close")]

    def __init__(self, bindings: list[Binding]) -> None:
        super().__init__(classes="dialog")
        self.bindings = bindings

    def compose(self):
        with VerticalScroll(classes="dialog-box help"):
            yield Markdown(
                "# edgespec: keys\n\n"
                + bindings_table(self.bindings)
                + "\n\nEvery action is also in the command palette (`ctrl+p`).\n\n"
                "With token colours on (`ctrl+t`), highlighted text came from draft tokens the "
                "target model accepted; plain text is the target's own tokens."
            )
