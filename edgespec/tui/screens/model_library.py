"""The model library: the registry's pairs and models, installed or not, size,
where from. Pull one (a progress bar with bytes, speed and ETA; cancellable),
or switch the chat to a pair or model (dismisses with a ModelChoice)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from rich.text import Text
from textual import on, work
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Button, DataTable, Footer, Header, Label, ProgressBar, Static

from edgespec.errors import terminal_text
from edgespec.models.progress import human_bytes
from edgespec.tui.library import Library, LibraryRow, ModelChoice, PullCancelled, PullProgress, cancellable


def shown(text: str, style: str = "") -> Text:
    """`text` as words, not markup, and fit for a terminal: a registry's, a hub's file names
    and a download's error are others' words, and may hold an escape."""
    return Text(terminal_text(text), style=style)


def describe_progress(p: PullProgress) -> str:
    """"412.0 MB / 1.1 GB · 23.5 MB/s · 30 s left"."""
    parts = [f"{human_bytes(p.done)} / {human_bytes(p.total)}"]
    if p.speed:
        parts.append(f"{human_bytes(p.speed)}/s")
    if p.eta is not None:
        parts.append(f"{p.eta:.0f} s left")
    if p.what:
        parts.insert(0, p.what)
    return " · ".join(parts)


class ModelsScreen(Screen[ModelChoice | None]):
    """Pairs and models of the registry."""

    BINDINGS = [
        Binding("escape", "close", "Back"),
        Binding("p", "pull", "Pull"),
        Binding("u", "use", "Use"),
        Binding("c", "cancel", "Cancel download"),
    ]

    @dataclass
    class Progressed(Message):
        """How far the pull is (posted from the pull's thread)."""

        progress: PullProgress

    @dataclass
    class PullEnded(Message):
        """The pull of `name` is done, cancelled or failed (posted from the pull's thread)."""

        name: str
        problem: str | None
        """Why it ended without the model (None: pulled)."""

    def __init__(self, library: Library, *, current: ModelChoice | None = None) -> None:
        super().__init__()
        self.library = library
        self.current = current
        self.rows: list[LibraryRow] = []
        self._cancel = threading.Event()
        self.pulling: str | None = None

    def compose(self):
        yield Header()
        with Vertical(id="models"):
            yield Label("Model library: p pull · u use · c cancel download · Esc back", classes="title")
            yield DataTable(id="library", cursor_type="row", zebra_stripes=True)
            with Vertical(id="download"):
                yield Static("", id="download-status")
                yield ProgressBar(id="download-progress", show_eta=False)
            with Horizontal(classes="buttons"):
                yield Button("Pull", variant="primary", id="pull")
                yield Button("Use", id="use")
                yield Button("Cancel download", variant="error", id="cancel", disabled=True)
                yield Button("Back", id="back")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("", "Name", "Model", "Kind", "Size", "Source", "Description")
        self.query_one("#download").display = False
        self.reload()
        table.focus()

    def reload(self) -> None:
        """Re-read the library (after a pull, installed marks change), the same row kept
        chosen: "Use" after a pull must load the model pulled, not the first row's."""
        table = self.query_one(DataTable)
        chosen = self.selected()
        table.clear()
        try:
            self.rows = self.library.rows()
        except Exception as e:
            self.query_one("#download").display = True
            self.query_one("#download-status", Static).update(shown(f"Cannot read the registry: {e}", style="bold red"))
            self.rows = []
        current = self.current.pair or self.current.target if self.current else None
        for row in self.rows:
            mark = "✔" if row.installed else " "
            name = shown(row.name, style="bold" if row.name == current else "")
            # Text, not a str: a table reads a str as markup, and these are the words of a
            # models.yaml ("beta [/]" raised MarkupError as the table was drawn)
            table.add_row(mark, name, *map(shown, (row.title or row.name, row.kind, human_bytes(row.size), row.source,
                                                   row.description)), key=row.name)
        names = [row.name for row in self.rows]
        if chosen is not None and chosen.name in names:
            table.move_cursor(row=names.index(chosen.name))

    def selected(self) -> LibraryRow | None:
        table = self.query_one(DataTable)
        if not self.rows or table.cursor_row is None or table.cursor_row >= len(self.rows):
            return None
        return self.rows[table.cursor_row]

    def action_close(self) -> None:
        if not self._downloading():
            self.dismiss(None)

    def _downloading(self) -> bool:
        """Whether a download runs, which leaving the library would cancel (said)."""
        if self.pulling:
            self.notify("A download is running: cancel it first (c).", severity="warning")
        return self.pulling is not None

    def action_use(self) -> None:
        row = self.selected()
        if row is None or self._downloading():
            return
        if not row.installed:
            self.notify(f"{row.name} is not installed yet: pull it first (p).", severity="warning")
            return
        self.dismiss(ModelChoice(pair=row.name) if row.kind == "pair" else ModelChoice(target=row.name))

    def action_pull(self) -> None:
        row = self.selected()
        if row is None or self.pulling:
            return
        self.pulling = row.name
        self._cancel.clear()
        self.query_one("#download").display = True
        self.query_one("#download-status", Static).update(shown(f"Pulling {row.name}…"))
        self.query_one("#download-progress", ProgressBar).update(total=None, progress=0)
        self.query_one("#cancel", Button).disabled = False
        self._pull_worker(row.name)

    def action_cancel(self) -> None:
        if self.pulling:
            self._cancel.set()

    def on_unmount(self) -> None:
        self._cancel.set()  # a download nobody can see any more stops (what it fetched is kept to resume)

    @work(thread=True, exclusive=True, group="pull")
    def _pull_worker(self, name: str) -> None:
        def show(p: PullProgress) -> None:
            self.post_message(self.Progressed(p))

        try:
            self.library.pull(name, progress=cancellable(show, self._cancel))
        except PullCancelled:
            self.post_message(self.PullEnded(name, "Download cancelled."))
        except Exception as e:  # DownloadError and friends: say why
            self.post_message(self.PullEnded(name, f"Download failed: {e}"))
        else:
            self.post_message(self.PullEnded(name, None))

    @on(Progressed)
    def _show_progress(self, event: Progressed) -> None:
        p = event.progress
        self.query_one("#download-progress", ProgressBar).update(total=p.total, progress=p.done)
        self.query_one("#download-status", Static).update(shown(describe_progress(p)))

    @on(PullEnded)
    def _pull_done(self, event: PullEnded) -> None:
        name, problem = event.name, event.problem
        self.pulling = None
        self.query_one("#cancel", Button).disabled = True
        status = self.query_one("#download-status", Static)
        if problem:
            status.update(shown(f"{name}: {problem}", style="bold red" if "failed" in problem else "yellow"))
        else:
            status.update(shown(f"{name} is installed.", style="bold green"))
            self.query_one("#download-progress", ProgressBar).update(progress=self.query_one("#download-progress", ProgressBar).total or 0)
            self.reload()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        action = {"pull": self.action_pull, "use": self.action_use, "cancel": self.action_cancel,
                  "back": self.action_close}[event.button.id]
        action()
