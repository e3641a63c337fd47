"""The files attached to the message being written, as chips above the prompt:
name, size and tokens; a click (or Delete on a focused chip) removes one."""

from __future__ import annotations

from dataclasses import dataclass

from textual.containers import Horizontal
from textual.message import Message
from textual.widgets import Static

from edgespec.errors import terminal_text
from edgespec.models.progress import human_bytes


@dataclass(frozen=True)
class Chip:
    """A file waiting to be sent."""

    path: str
    size: int
    """Bytes."""
    tokens: int | None = None
    """What the model reads of it (None: not counted, no model loaded)."""

    @property
    def label(self) -> str:
        tokens = f" · {self.tokens:,} tok" if self.tokens is not None else ""
        return f"📎 {self.path} · {human_bytes(self.size)}{tokens} ✕"


class ChipView(Static, can_focus=True):
    """One chip."""

    BINDINGS = [("delete,backspace", "remove", "Remove file")]

    def __init__(self, chip: Chip) -> None:
        super().__init__(terminal_text(chip.label), classes="chip", markup=False)  # a name may hold an escape
        self.chip = chip

    def on_click(self) -> None:
        self.action_remove()

    def action_remove(self) -> None:
        self.post_message(AttachmentBar.Removed(self.chip.path))


class AttachmentBar(Horizontal):
    """The chips of the message being written; hidden while there are none."""

    @dataclass
    class Removed(Message):
        """The user removed a file from the message."""

        path: str

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.chips: list[Chip] = []

    def on_mount(self) -> None:
        self.display = False

    @property
    def paths(self) -> list[str]:
        return [c.path for c in self.chips]

    async def add(self, chip: Chip) -> bool:
        """Show `chip` (False: that file is attached already)."""
        if chip.path in self.paths:
            return False
        self.chips.append(chip)
        await self.mount(ChipView(chip))
        self.display = True
        return True

    async def remove_path(self, path: str) -> None:
        self.chips = [c for c in self.chips if c.path != path]
        for view in self.query(ChipView):
            if view.chip.path == path:
                await view.remove()
        self.display = bool(self.chips)

    async def clear_chips(self) -> None:
        self.chips = []
        await self.remove_children()
        self.display = False
