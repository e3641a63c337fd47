"""The file picker: a tree of the project folder; Enter on a file attaches it."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from rich.text import Text
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DirectoryTree, Label

from edgespec.errors import EdgespecError, terminal_text
from edgespec.workspace.root import SKIPPED_NAMES, Workspace


class ProjectTree(DirectoryTree):
    """The project folder without hidden entries and the folders `@` completion leaves out."""

    def process_label(self, label):
        """A name fit for a terminal: a file of a cloned repository may hold an escape in its name."""
        return super().process_label(terminal_text(label) if isinstance(label, str) else label)

    def filter_paths(self, paths: Iterable[Path]) -> Iterable[Path]:
        return [p for p in paths if not p.name.startswith(".") and p.name not in SKIPPED_NAMES]


class FilePickerScreen(ModalScreen[str | None]):
    """Choose a file of the project folder; dismissed with its path relative to the folder (None: cancelled)."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]

    def __init__(self, workspace: Workspace) -> None:
        super().__init__(classes="dialog")
        self.workspace = workspace

    def compose(self):
        with Vertical(classes="dialog-box picker"):
            # Text, not a str: a str is read as markup, and a folder may be named `[WIP] app` (or hold an escape)
            yield Label(Text(terminal_text(f"Attach a file from {self.workspace.root}  (Enter attaches, Esc cancels)")))
            yield ProjectTree(self.workspace.root, id="tree")

    def on_mount(self) -> None:
        self.query_one(ProjectTree).focus()

    def on_directory_tree_file_selected(self, event: DirectoryTree.FileSelected) -> None:
        """Attach the file, unless its path leads out of the project (a symlink) or
        nowhere (a loop): that is said, and another may be chosen."""
        event.stop()
        try:
            path = self.workspace.relative(event.path)
        except EdgespecError as e:
            self.notify(str(e), title="Not attached", severity="error")
            return
        self.dismiss(path)
