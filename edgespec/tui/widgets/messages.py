"""One message of the conversation on screen: a header, the text, the reply's statistics.

What a terminal would act on (errors.terminal_text) is left out of what is shown.
A user's text is shown as typed; a reply's is Markdown, streamed with `Markdown.get_stream()` while a reply is
generated; with the origin view on, it is plain text coloured by where each
token came from (accepted draft token or the target's own).
"""

from __future__ import annotations

import re

from rich.text import Text
from textual.containers import Vertical
from textual.widgets import Markdown, Static

from edgespec.chat.words import stats_line
from edgespec.engine.events import Stats
from edgespec.errors import terminal_text
from edgespec.tui import origin

ROLE_TITLES = {"user": "You", "assistant": "Assistant", "system": "System"}
STATUS_NOTES = {"stopped": "stopped", "interrupted": "interrupted", "error": "error"}


def reply_stats(stats: Stats | None) -> str:
    """One line about a finished reply: tokens, speed, and how speculation did."""
    return stats_line(stats)


_FENCE = re.compile(r"^( *)(`{3,}(?=[^`]*$)|~{3,})")
"""An opening code fence (CommonMark): its indentation, and its run of backticks (an
info string holding none) or tildes."""


def code_blocks(markdown: str) -> list[str]:
    """The fenced code blocks of a Markdown text, in order, without their fences. As
    CommonMark reads them: a block closes at a run of its fence's character at least
    as long (a ```` fence holds ``` ones), and its lines lose as much indentation as
    its opening fence had (a block in a list item is copied as code, not indented)."""
    blocks, current, fence, indent = [], None, "", 0
    for line in markdown.splitlines():
        if current is None:
            opening = _FENCE.match(line)
            if opening:
                indent, fence, current = len(opening.group(1)), opening.group(2), []
        elif line.strip().startswith(fence) and line.strip().strip(fence[0]) == "":
            blocks.append("\n".join(current))
            current = None
        else:
            current.append(line[min(indent, len(line) - len(line.lstrip(" "))):])
    if current:
        blocks.append("\n".join(current))
    return blocks


class MessageBox(Vertical, can_focus=True):
    """A message; focus one to copy, edit or regenerate it."""

    def __init__(self, role: str, content: str = "", *, index: int | None = None, status: str = "done",
                 stats: Stats | None = None, runs: list[tuple[str, bool]] | None = None,
                 show_origin: bool = False, attachments: list[str] | None = None) -> None:
        super().__init__(classes=f"message {role}")
        self.attachments = list(attachments or [])
        """Paths of the files the message carries."""
        self.role = role
        self.content = content
        self.index = index
        """Position in ChatSession.messages (None while unknown)."""
        self.status = status
        self.stats = stats
        self.runs = list(runs or [])
        self.show_origin = show_origin
        self._stream = None
        self.streaming = False

    def compose(self):
        yield Static(self._header_text(), classes="header")
        if self.attachments:
            yield Static(Text(terminal_text("  ".join(f"📎 {path}" for path in self.attachments))),
                         classes="attachments")
        if self.role == "user":  # as typed or pasted: code without a fence keeps its lines
            yield Static(Text(terminal_text(self.content)), classes="body")
        else:
            yield Markdown(terminal_text(self.content), classes="body")
        yield Static(origin.render(self.runs or [(self.content, False)]), classes="origin")
        # not markup: the line names the files tokens were looked up in (`[/]x.py`)
        yield Static(terminal_text(reply_stats(self.stats)), classes="stats", markup=False)

    def on_mount(self) -> None:
        self._apply_origin_view()

    def _header_text(self) -> str:
        title = ROLE_TITLES.get(self.role, self.role)
        note = STATUS_NOTES.get(self.status)
        if self.streaming:
            note = "generating…"
        return f"{title} · {note}" if note else title

    def _apply_origin_view(self) -> None:
        coloured = self.show_origin and self.role == "assistant"
        self.query_one(".body").display = not coloured
        self.query_one(".origin", Static).display = coloured
        self.set_class(self.status != "done", "unfinished")
        self.query_one(".stats", Static).display = bool(self.stats)

    def set_show_origin(self, show: bool) -> None:
        self.show_origin = show
        if show:
            self.query_one(".origin", Static).update(origin.render(self.runs or [(self.content, False)]))
        self._apply_origin_view()

    def begin(self) -> None:
        """Mark the reply as being generated."""
        self.streaming = True
        self.query_one(".header", Static).update(self._header_text())

    async def write(self, text: str, runs: list[tuple[str, bool]]) -> None:
        """Append streamed text (the app's redraw timer hands over what the decode thread produced)."""
        self.content += text
        self.runs.extend(runs)
        if self.show_origin:
            self.query_one(".origin", Static).update(origin.render(self.runs))
        if text:
            if self._stream is None:
                self._stream = Markdown.get_stream(self.query_one(".body", Markdown))
            await self._stream.write(terminal_text(text))

    async def finish(self, *, content: str, status: str, stats: Stats | None) -> None:
        """The reply ended: settle the text, show its status and statistics."""
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        self.streaming = False
        self.status = status
        self.stats = stats
        if content != self.content:
            self.content = content
        await self.query_one(".body", Markdown).update(terminal_text(self.content))
        self.query_one(".origin", Static).update(origin.render(self.runs or [(self.content, False)]))
        self.query_one(".header", Static).update(self._header_text())
        self.query_one(".stats", Static).update(terminal_text(reply_stats(stats)))
        self._apply_origin_view()
