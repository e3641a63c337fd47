"""The settings screen: system prompt, sampling, speculation and hardware.

Dismisses with `SettingsResult` (the new settings, and whether to make them
the app-wide defaults too) or None when cancelled.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.binding import Binding
from textual.containers import Grid, Horizontal, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Input, Label, Select, Static, TextArea

from edgespec.engine.events import MODES
from edgespec.limits import ascii_number
from edgespec.load_settings import FLASH_ATTN, LOAD_LIMITS
from edgespec.tui.chat_settings import AUTO, ChatSettings
from edgespec.tui.widgets.long_text import LongTextArea

PAIRS = "the pair's"
"""How a mode or k left to the pair (models.yaml) is shown."""

LABELS = {
    "temperature": "Temperature (0 = greedy)",
    "top_k": "Top-k (0 = off)",
    "top_p": "Top-p (1 = off)",
    "max_tokens": "Max tokens",
    "k": f"Draft length k (empty = {PAIRS})",
    "n_ctx": f"Context size, tokens ({AUTO} = fit models and memory)",
    "n_gpu_layers": f"GPU layers, target ({AUTO}, -1 = all)",
    "n_gpu_layers_draft": f"GPU layers, draft ({AUTO}, -1 = all)",
    "n_threads": f"Threads ({AUTO} = all cores)",
    "rpc": "RPC workers (host:port,...)",
}
WHOLE = {"top_k", "max_tokens", "k", *LOAD_LIMITS}
"""The fields that take whole numbers (the load settings' also take AUTO)."""


def _whole(label: str, text: str) -> int:
    """`text` as a whole number written with the digits 0-9 (limits.ascii_number: int()
    reads '１２８' as 128); ValueError naming the field `label` where it is not one."""
    ascii_number(text, what=label)
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{label}: {text!r} is not a whole number") from None


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
            yield Label(Text(f"Settings for {scope}"), classes="title")  # a title is words, not markup
            yield Label("System prompt")
            # a LongTextArea leaves out what a terminal would act on (an imported chat's prompt may hold an escape)
            yield LongTextArea(self.settings.system_prompt, id="system_prompt", soft_wrap=True)
            with Grid(classes="fields"):
                yield Label("Speculation mode")
                yield Select([(m, m) for m in MODES], value=self.settings.mode or Select.NULL, prompt=PAIRS,
                             id="mode")
                stored = self.settings.to_dict()
                for name, label in LABELS.items():
                    yield Label(label)
                    blank = "" if name == "k" else AUTO
                    yield Input(blank if stored[name] is None else str(stored[name]), id=name)
                yield Label("Flash attention")
                yield Select([(name, name) for name in FLASH_ATTN], value=stored["flash_attn"], allow_blank=False,
                             id="flash_attn")
                yield Label("Exact kernels (greedy = plain)")
                yield Checkbox("exact", value=self.settings.load.exact, id="exact")
                yield Label("Private (not drafted from elsewhere)")
                yield Checkbox("private", value=self.settings.private, id="private")
            yield Static("", id="error")
            with Horizontal(classes="buttons"):
                yield Button("Save", variant="primary", id="save")
                yield Button("Save as default", id="default")
                yield Button("Cancel", id="cancel")

    def read(self) -> ChatSettings:
        """The settings as entered; raises ValueError with a message for the user."""
        data = {name: self.query_one(f"#{name}", Input).value.strip() for name in LABELS}
        mode = self.query_one("#mode", Select).value
        data["mode"] = None if mode is Select.NULL else mode
        data["flash_attn"] = self.query_one("#flash_attn", Select).value
        data["exact"] = self.query_one("#exact", Checkbox).value
        data["private"] = self.query_one("#private", Checkbox).value
        data["system_prompt"] = self.query_one("#system_prompt", TextArea).text
        for name in WHOLE:
            if name in LOAD_LIMITS and data[name].lower() in (AUTO, ""):
                data[name] = AUTO
            elif name == "k" and not data[name]:
                data[name] = None
            else:
                data[name] = _whole(LABELS[name], data[name])
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
