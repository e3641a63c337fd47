"""What the chat screen is given by its app: one `ChatContext`.

It holds the conversation store, the project folder, the export folder, the
decoding lock, the session factory and the chat format, the defaults of a new
chat, and `Models`: the models as the app loads them, whose signals tell the
screen when they change (as Elia's screens hear of their settings). What only
the app can do, the context asks of it through the callables it was given
(decoding of the pair, loading the models again for other settings). The chat
screen reads nothing else of the app.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from textual.dom import DOMNode
from textual.signal import Signal

from edgespec.chat.store import ConversationStore
from edgespec.engine.protocol import ChatEngine
from edgespec.tui.chat_settings import ChatSettings
from edgespec.tui.library import PullProgress
from edgespec.tui.stream import RENDER_SHARE
from edgespec.workspace.root import Workspace


class Models:
    """The models as the app has them: which, in what state, and their engine once loaded.

    The app changes them through `loading`, `ready`, `fail` and `report`, which
    publish the change: `changed` with the state (each time it is set, the same
    state again included), `progressed` with how far the files being loaded are.
    A subscriber reads `state` and `progress` for what was published before it came."""

    def __init__(self, owner: DOMNode, name: str) -> None:
        self.name = name
        """The models chosen (ModelChoice.label): what a conversation calls the model."""
        self.label = name
        """Which models are loaded (or being loaded), and once loaded where they run."""
        self.state = "loading"
        """"loading", "ready" or "failed"."""
        self.engine: ChatEngine | None = None
        """The loaded engine; None while there is none (the load worker's thread clears it)."""
        self.error = ""
        """Why the models failed to load."""
        self.render_share: float | None = RENDER_SHARE
        """The screen's share of a CPU while a reply streams, for where they run (tui/stream.py)."""
        self.progress: PullProgress | None = None
        """How far the files being loaded are assembled, made or verified (None: no such work yet)."""
        self.changed: Signal[str] = Signal(owner, "models-changed")
        """Published with `state` whenever it is set."""
        self.progressed: Signal[PullProgress] = Signal(owner, "models-progressed")
        """Published, while loading, with how far the files are assembled, made or verified."""

    def loading(self, name: str) -> None:
        """The models `name` are being loaded."""
        self.name = self.label = name
        self.progress = None
        self._set_state("loading")

    def ready(self, engine: ChatEngine, *, label: str, render_share: float | None) -> None:
        """`engine` is loaded; `label` says which models and where they run."""
        self.engine, self.label, self.render_share, self.error = engine, label, render_share, ""
        self._set_state("ready")

    def fail(self, reason: str) -> None:
        """The models cannot be used: `reason` says why."""
        self.error = reason
        self._set_state("failed")

    def report(self, progress: PullProgress) -> None:
        """How far the files being loaded are (heard only while loading)."""
        if self.state == "loading":
            self.progress = progress
            self.progressed.publish(progress)

    def _set_state(self, state: str) -> None:
        self.state = state
        self.changed.publish(state)


@dataclass
class ChatContext:
    """What the chat screen is given by its app, and all that it reads of it."""

    store: ConversationStore
    """Where conversations, their settings and their replies are kept."""
    workspace: Workspace
    """The project folder: files are attached from it and edits written to it, nothing outside."""
    export_dir: Path
    """Where a conversation is exported as Markdown."""
    models: Models
    """The models and their engine, as the app loads them."""
    decoding: threading.Lock
    """Held by the reply worker while it uses the engine (the app takes it before freeing the models)."""
    session_factory: Callable
    """Makes a chat session: (engine, **options) -> ChatSession."""
    template: str | None
    """A built-in chat format's name (or Jinja source) instead of the GGUF's own."""
    pair_decoding: Callable[[], tuple[str, int]]
    """The mode and k replies decode with where their settings name none (the pair's, from models.yaml)."""
    reload_for: Callable[[ChatSettings], None]
    """Asks the app to load the models again if these settings want other hardware than the last load asked for."""
    defaults: ChatSettings = field(default_factory=ChatSettings)
    """The settings of a new chat (the app sets them once read, and when settings are saved as the default)."""
