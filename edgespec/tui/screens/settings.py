"""The settings screen: system prompt, sampling, speculation and hardware.

Dismisses with `SettingsResult` (the new settings, and whether to make them
the app-wide defaults too) or None when cancelled.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from rich.text import Text
from textual.binding import Binding
from textual.containers import Grid, Horizontal, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Input, Label, Select, Static, TextArea

from edgespec.engine.events import MODES
from edgespec.tui.settings import AUTO, GPU_LAYERS, ChatSettings

LABELS = {
    "temperature": "Temperature (0 = greedy)",
    "top_k": "Top-k (0 = off)",
    "top_p": "Top-p (1 = off)",
    "max_tokens": "Max tokens",
    "k": "Draft length k",
    "gpu_layers_target": f"GPU layers, target ({AUTO}, -1 = all)",
    "gpu_layers_draft": f"GPU layers, draft ({AUTO}, -1 = all)",
    "threads": "Threads (0 = all cores)",
    "rpc": "RPC workers (host:port,...)",
}


@dataclass
class SettingsResult:
    settings: ChatSettings
    as_default: bool = False


class SettingsScreen(ModalScreen[SettingsResult | None]):
    """Edit a conversation's settings."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel"), Binding("ctrl+s", "save", "Save", priority=True)]

    def __init__(self, settings: ChatSettings, *, conversation_title: str | None = None) -> None:
        super().__init__(classes="dialog")
        self.settings = settings
        self.conversation_title = conversation_title

    def compose(self):
        with VerticalScroll(classes="dialog-box settings"):
            scope = f"“{self.conversation_title}”" if self.conversation_title else "new chats"
            yield Label(f"Settings for {scope}", classes="title")
            yield Label("System prompt")
            yield TextArea(self.settings.system_prompt, id="system_prompt", soft_wrap=True)
            with Grid(classes="fields"):
                yield Label("Speculation mode")
                yield Select([(m, m) for m in MODES], value=self.settings.mode, allow_blank=False, id="mode")
                for name, label in LABELS.items():
                    yield Label(label)
                    value = getattr(self.settings, name)
                    yield Input(AUTO if value is None and name in GPU_LAYERS else str(value), id=name)
                yield Label("Exact kernels (greedy = plain)")
                yield Checkbox("exact", value=self.settings.exact, id="exact")
            yield Static("", id="error")
            with Horizontal(classes="buttons"):
                yield Button("Save", variant="primary", id="save")
                yield Button("Save as default", id="default")
                yield Button("Cancel", id="cancel")

    def read(self) -> ChatSettings:
        """The settings as entered; raises ValueError with a message for the user."""
        data = {name: self.query_one(f"#{name}", Input).value.strip() for name in LABELS}
        data["mode"] = self.query_one("#mode", Select).value
        data["exact"] = self.query_one("#exact", Checkbox).value
        data["system_prompt"] = self.query_one("#system_prompt", TextArea).text
        kinds = {f.name: f.type for f in fields(ChatSettings)}
        for name in LABELS:
            if name in GPU_LAYERS and data[name].lower() in (AUTO, ""):
                data[name] = AUTO
            elif kinds[name] in ("int", int) or name in GPU_LAYERS:
                try:
                    data[name] = int(data[name])
                except ValueError:
                    raise ValueError(f"{LABELS[name]}: {data[name]!r} is not a whole number") from None
        return ChatSettings.from_dict(data, defaults=self.settings)

    def action_save(self, as_default: bool = False) -> None:
        try:
            settings = self.read()
        except ValueError as e:
            self.query_one("#error", Static).update(Text.assemble(("Not saved: ", "bold"), str(e)))
            return
        self.dismiss(SettingsResult(settings, as_default=as_default))

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "cancel":
            self.dismiss(None)
        else:
            self.action_save(as_default=event.button.id == "default")
