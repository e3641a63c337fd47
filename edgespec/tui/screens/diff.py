"""A reply's changes to attached files, as coloured diffs against the files on
disk; `a` applies them all, Esc closes (F7 shows them again)."""

from __future__ import annotations

from typing import Sequence

from rich.text import Text
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static

from edgespec.chat.attachments import PendingEdit
from edgespec.errors import terminal_text
from edgespec.workspace.edits import unified_diff
from edgespec.workspace.root import Workspace

DIFF_STYLES = (("+++", "bold"), ("---", "bold"), ("@@", "cyan"), ("+", "green"), ("-", "red"))
"""How a diff line is coloured, by how it starts (first match)."""


def coloured_diff(diff: str) -> Text:
    text = Text()
    for line in diff.splitlines(keepends=True):
        style = next((s for start, s in DIFF_STYLES if line.startswith(start)), "")
        text.append(terminal_text(line), style=style)
    return text


def review(workspace: Workspace, pending: PendingEdit) -> tuple[str, str | None]:
    """The diff of `pending` against the file on disk now, and why it cannot be applied (None: it can)."""
    try:
        now = workspace.sha256_of(pending.path)
        on_disk = workspace.read(pending.path).text if now else ""
    except Exception as e:  # unreadable now: the diff is against what the reply saw
        return pending.diff, str(e)
    if now is None and pending.base_sha256 is not None:  # gone: against what the reply saw, too
        return pending.diff, "it was deleted after the reply was written"
    problem = None
    if now != pending.base_sha256:
        problem = ("it exists now, but the reply creates it as a new file" if pending.base_sha256 is None
                   else "it changed on disk since the reply was written: send a message to show the model "
                        "its current content")
    return unified_diff(pending.path, on_disk, pending.edit.new_text), problem


class DiffScreen(ModalScreen[bool]):
    """The changes of a reply; dismissed with True when the user applies them."""

    BINDINGS = [Binding("escape", "dismiss(False)", "Close"), Binding("a", "apply", "Apply")]

    def __init__(self, workspace: Workspace, edits: Sequence[PendingEdit]) -> None:
        super().__init__(classes="dialog")
        self.workspace = workspace
        self.edits = list(edits)
        self.problems: list[str] = []

    def compose(self):
        with Vertical(classes="dialog-box diff"):
            yield Label(f"The reply changes {len(self.edits)} file{'s' if len(self.edits) != 1 else ''}: "
                        "a applies, Esc closes (F7 shows this again)")
            with VerticalScroll(id="diffs"):
                for pending in self.edits:
                    diff, problem = review(self.workspace, pending)
                    head = pending.path + (" (new file)" if pending.edit.new else "")
                    if problem:
                        self.problems.append(f"{pending.path}: {problem}")
                        head += f": cannot be applied, {problem}"
                    # a file's name may hold what a terminal would act on
                    yield Label(Text(terminal_text(head), style="bold red" if problem else "bold"))
                    if pending.edit.versions > 1:  # the diff shows only the last: say there were others
                        yield Label(Text(terminal_text(f"The reply writes {pending.path} whole {pending.edit.versions} "
                                                       "times: the last version is the one shown and applied."),
                                         style="yellow"), classes="versions")
                    yield Static(coloured_diff(diff or "(no change)\n"), classes="diff-body")
            with Horizontal(classes="buttons"):
                yield Button("Apply (a)", variant="primary", id="apply", disabled=bool(self.problems))
                yield Button("Close (Esc)", id="close")

    def action_apply(self) -> None:
        if self.problems:
            self.notify(self.problems[0], title="Not applied", severity="error")
            return
        self.dismiss(True)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "apply":
            self.action_apply()
        else:
            self.dismiss(False)
