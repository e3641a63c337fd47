"""The chat app: conversations in a sidebar, replies streamed as Markdown, a live
status line of speculation, and screens for models, settings and help.

The app holds what every screen shares: the models and their engine, the
default settings, the conversation store, the keys that work everywhere, and
the opening of the models, settings and help screens. The conversation itself
(its messages, the prompt, the status line, replies) is `ChatScreen`'s, and the
app gives that screen one `ChatContext` (edgespec/tui/chat_context.py): the store, the
project folder, the export folder, the decoding lock, the session factory, the
defaults, and `Models`, whose signals say when the models load, fail or are
ready. The chat screen reads nothing else of the app; what only the app can do
(load the models again for other settings) it asks through the context.

Decoding and model loading run in thread workers; they touch widgets only by
posting messages, which never wait for the screen (a worker that waited on a
screen that is closing would never end). A reply's chunks go into a
`ReplyBuffer` that the chat screen drains on a timer: the decode thread never
waits for a render, and the screen redraws only as often as keeps its own CPU
time within RENDER_SHARE (edgespec/tui/stream.py). The app is given how to load
an engine and how to make a chat session, so tests run it on a fake engine;
loading reports each model file assembled, made or verified as a
`ModelsProgressed` message, which the status line shows.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable, Protocol

from textual import events, on, work
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.message import Message

from edgespec import __version__
from edgespec.chat.store import ConversationStore, StoreError, clean_title
from edgespec.engine.protocol import ChatEngine
from edgespec.errors import ENDING_SIGNALS, EdgespecError, terminal_text
from edgespec.limits import LIMITS
from edgespec.load_settings import LoadSettings
from edgespec.models.progress import Progress, ProgressCallback
from edgespec.modes import DEFAULT_MODE
from edgespec.net import Split
from edgespec.tui.library import Library, ModelChoice, PullProgress, load_choice, pull_progress
from edgespec.tui.screens.chat import ChatScreen
from edgespec.tui.screens.help import HelpScreen
from edgespec.tui.screens.settings import SettingsResult, SettingsScreen
from edgespec.tui.chat_settings import ChatSettings, load_defaults, save_defaults
from edgespec.tui.chat_context import ChatContext, Models
from edgespec.tui.stream import redraw_share
from edgespec.tui.widgets.long_text import LongTextArea
from edgespec.tui.widgets.sidebar import store_failed
from edgespec.tui.widgets.status import context_label, hardware_label
from edgespec.workspace.root import Workspace


class EngineLoader(Protocol):
    def __call__(self, choice: ModelChoice, settings: ChatSettings, *, progress: ProgressCallback) -> ChatEngine:
        """A loaded Engine; raises EdgespecError with a message for the user. `progress`
        hears of each model file assembled, made or verified on the way."""


QUIT_WAIT_S = 30.0
"""How long quitting waits for the decode step in flight before leaving the
models to the process's exit: freeing them under a running decode would crash."""


def default_session_factory(engine, **kwargs):
    from edgespec.chat.session import ChatSession

    return ChatSession(engine, **kwargs)


def open_store() -> tuple[ConversationStore, str]:
    """The user's conversation store, and what opening it needs telling ("": nothing).
    A store that cannot be opened leaves the chat on in memory, saying why nothing is saved."""
    try:
        store = ConversationStore()
        return store, store.notice
    except StoreError as e:
        return ConversationStore(":memory:"), f"{e}\nConversations are not saved until this is fixed."


class EdgespecApp(App):
    """Chat with local GGUF models, sped up by speculative decoding."""

    CSS_PATH = "app.tcss"
    TITLE = "edgespec"

    BINDINGS = [Binding("f1,question_mark", "help", "Help")]
    """Keys that work on every screen; the chat's own are on ChatScreen."""

    @dataclass
    class ModelsLoaded(Message):
        """The load worker has loaded the models (posted from its thread)."""

        engine: ChatEngine
        load: int
        """Which load (the count of loads asked for when it was)."""

    @dataclass
    class ModelsProgressed(Message):
        """A model file is being assembled, made or verified (posted from the load worker's thread)."""

        progress: PullProgress
        load: int
        """Which load (the count of loads asked for when it was)."""

    @dataclass
    class ModelsFailed(Message):
        """The models could not be loaded (posted from the load worker's thread)."""

        reason: str
        load: int
        """Which load (the count of loads asked for when it was)."""

    def __init__(self, choice: ModelChoice | None = None, *, store=None,
                 load: EngineLoader | None = None, session_factory: Callable | None = None,
                 library: Library | Callable[[], Library] | None = None,
                 defaults: ChatSettings | None = None, defaults_path: str | Path | None = None,
                 export_dir: str | Path | None = None, template: str | None = None,
                 rpc: str | None = None, cache=None, load_given: LoadSettings | None = None,
                 root: str | Path | None = None) -> None:
        super().__init__()
        self.choice = choice or ModelChoice()
        self.store, self._store_problem = (store, "") if store is not None else open_store()
        """The conversation store, and what opening it needed telling (shown once the app is up)."""
        self._owns_store = store is None
        """Whether the app opened the store, and so closes it as it ends (a store given is the giver's)."""
        self._load: EngineLoader = load or self._load_installed
        self._library = library
        self.defaults_path = defaults_path
        self._defaults = defaults
        """The defaults given; None: read from `defaults_path` once the app is up."""
        self.rpc = rpc
        """The Split given on the command line (workers, tensor split, output layer): its
        workers replace the settings' for this run, and while the settings keep them, it is
        the split loaded."""
        self.cache = cache
        """The engine's CacheSettings (conversations held at once, snapshots); None: the defaults."""
        self.load_given = load_given
        """The command line's LoadSettings: what it gives replaces the default settings' for this run."""
        self.models = Models(self, self.choice.label)
        """The models and their engine; the chat screen hears of their changes through its signals."""
        self._loads_asked = 0
        """How many loads were asked for. A load overtaken by a newer one (a thread runs to its
        end) is not the models asked for: what it loaded is freed, and its progress and failure not said."""
        self._load_hardware: LoadSettings | None = None
        """The settings' hardware (ChatSettings.hardware()) of the latest load asked for, under
        way, done or failed: settings that want other hardware load the models again."""
        self.context = ChatContext(
            store=self.store, workspace=Workspace(root or Path.cwd()),
            export_dir=Path(export_dir) if export_dir else Path.cwd(), models=self.models,
            decoding=threading.Lock(), session_factory=session_factory or default_session_factory,
            template=template, pair_decoding=self.pair_decoding, reload_for=self.reload_for)
        """All that the chat screen is given of the app."""
        self._chat = ChatScreen(self.context)
        self.ended_by: int | None = None
        """The signal that ended the app (ENDING_SIGNALS); None: the user quit it."""
        self._handlers_before: dict[int, object] = {}
        """The handlers of ENDING_SIGNALS before the app took them, given back as it ends."""

    @property
    def chat(self) -> ChatScreen:
        """The chat screen (the app's first)."""
        return self._chat

    def get_default_screen(self) -> ChatScreen:
        return self._chat

    def notify(self, message: str, *, title: str = "", severity="information", timeout: float | None = None,
               markup: bool = False) -> None:
        """A notice, always shown as written: notices name the user's files, titles and
        errors (`[/]x.py`, `list[int]`), which Textual would read as markup (changed, or a
        MarkupError as the notice is drawn, ending the app); none of edgespec's is markup.
        A name holding a terminal escape is shown without it (errors.terminal_text).
        Widgets pass markup=True by default (Widget.notify), so it is not taken from them."""
        del markup
        super().notify(terminal_text(message), title=terminal_text(title), severity=severity, timeout=timeout,
                       markup=False)

    def check_action(self, action: str, parameters) -> bool | None:
        """The models and settings screens open from the chat, not over a dialog."""
        if action in ("settings", "models"):
            return self.screen is self._chat
        return True

    # -- pieces ------------------------------------------------------------------------
    @property
    def model_state(self) -> str:
        """"loading", "ready" or "failed" (Models.state)."""
        return self.models.state

    @property
    def model_label(self) -> str:
        """Which models are loaded (or being loaded), and once loaded where they run (Models.label)."""
        return self.models.label

    @property
    def library(self) -> Library:
        if self._library is None or (callable(self._library) and not hasattr(self._library, "rows")):
            from edgespec.tui.library import RegistryLibrary

            self._library = self._library() if callable(self._library) else RegistryLibrary()
        return self._library

    async def on_event(self, event: events.Event) -> None:
        if isinstance(event, events.Key) and not event.is_forwarded:
            focused = self.focused
            if isinstance(focused, LongTextArea) and focused.typing_only(event):
                # A character typed into a text goes straight to it: Textual would first search
                # every binding on the way for a priority one, which a text area that takes the
                # key overrides anyway (a paste that arrives as keys is thousands of them).
                if not self.app_focus:
                    self.app_focus = True
                focused._forward_event(event)
                return
        await super().on_event(event)

    def on_mount(self) -> None:
        self._take_ending_signals()
        self.sub_title = f"v{__version__}"
        defaults = self._defaults
        if defaults is None:
            try:
                defaults = load_defaults(self.defaults_path)
            except ValueError as e:
                defaults = ChatSettings()
                self.notify(str(e), title="Settings file ignored", severity="warning", timeout=10)
        if self.load_given is not None:
            defaults = replace(defaults, load=self.load_given.over(defaults.load))
        if self.rpc is not None:  # the settings keep the workers; the split goes with them (load_choice)
            defaults = replace(defaults, load=replace(defaults.load, rpc=Split(self.rpc.workers)))
        self.context.defaults = self._chat.settings = defaults
        if self._store_problem:
            self.notify(self._store_problem, title="Conversations", severity="error", timeout=30)
        self.load_models(self.choice)

    # -- models ------------------------------------------------------------------------
    def load_models(self, choice: ModelChoice) -> None:
        """Load `choice` in the background; the status line shows loading / ready / failed."""
        self.choice = choice
        self.models.loading(choice.label)
        self._load_hardware = self._chat.settings.hardware()
        self._loads_asked += 1
        self._load_worker(choice, self._chat.settings, self._loads_asked)

    def pair_decoding(self) -> tuple[str, int]:
        """The mode and k replies decode with where their settings name none: those the
        pair recommends (models.yaml); for models named by file, the defaults."""
        if self.choice.pair and not self.choice.target:
            try:
                return self.library.decoding(self.choice.pair)
            except EdgespecError:  # an unknown pair fails to load, and says so there
                pass
        return DEFAULT_MODE, LIMITS["k"].default

    def reload_for(self, settings: ChatSettings) -> None:
        """Load the models again if `settings` want other hardware than they were last loaded
        with, or asked to be (a load that failed is tried again for the hardware that worked)."""
        if self._load_hardware != settings.hardware():
            self.load_models(self.choice)

    def _load_installed(self, choice: ModelChoice, settings: ChatSettings, *,
                        progress: ProgressCallback) -> ChatEngine:
        """The models of the library, installed ones only (slow: the load worker calls it)."""
        return load_choice(choice, settings, library=self.library, progress=progress, cache=self.cache,
                           split=self.rpc)

    @work(thread=True, exclusive=True, group="load")
    def _load_worker(self, choice: ModelChoice, settings: ChatSettings, load: int) -> None:
        old, self.models.engine = self.models.engine, None
        if old is not None:
            old.interrupt()  # a reply or a reading ahead (tui/screens/chat.py) ends at its next batch
            with self.context.decoding:  # freeing the models under a running decode would crash
                old.close()

        def report(progress: Progress) -> None:
            self.post_message(self.ModelsProgressed(pull_progress(progress), load))

        try:
            engine = self._load(choice, settings, progress=report)
        except EdgespecError as e:
            self.post_message(self.ModelsFailed(str(e), load))
            return
        except Exception as e:  # a bug or an unexpected library error: show it, don't crash
            self.post_message(self.ModelsFailed(f"{type(e).__name__}: {e}", load))
            return
        if not self.post_message(self.ModelsLoaded(engine, load)):
            engine.close()  # the app has closed meanwhile

    @on(ModelsLoaded)
    def _models_ready(self, event: ModelsLoaded) -> None:
        engine = event.engine
        if event.load != self._loads_asked:  # overtaken: never used, so freed without the decoding lock
            self.run_worker(engine.close, thread=True, group="free")
            return
        self.models.engine = engine
        try:
            info = engine.describe()
        except Exception as e:  # the models work; only the label goes without where they run
            info = None
            self.log.error(f"engine.describe() failed: {e!r}")
            self.notify(f"Could not tell where the models run: {e}", severity="warning")
        where = " · ".join(part for part in (hardware_label(info), context_label(engine.n_ctx)) if part)
        self.models.ready(engine, label=f"{self.choice.label} ({where})", render_share=redraw_share(info))

    @on(ModelsProgressed)
    def _models_progressed(self, event: ModelsProgressed) -> None:
        if event.load == self._loads_asked:
            self.models.report(event.progress)

    @on(ModelsFailed)
    def _on_models_failed(self, event: ModelsFailed) -> None:
        if event.load == self._loads_asked:
            self.models.fail(event.reason)

    # -- screens -------------------------------------------------------------------------
    def action_help(self) -> None:
        """Show the key bindings."""
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(ChatScreen.BINDINGS))

    def action_settings(self) -> None:
        """Edit the settings of this conversation (or of new chats)."""
        self._chat.follow_new_conversation()  # stored with its first message, before the reply's first token
        cid = self._chat.conversation_id
        try:
            title = clean_title(self.store.title(cid) or "") if cid is not None else None  # as the sidebar shows it
        except StoreError as e:  # the settings are the screen's: only the title is missing
            store_failed(self, e)
            title = None
        self.push_screen(SettingsScreen(self._chat.settings, conversation_title=title), self._settings_saved)

    def _settings_saved(self, result: SettingsResult | None) -> None:
        if result is None:
            return
        self._chat.use_settings(result.settings)
        if result.as_default:
            self.context.defaults = result.settings
            try:
                path = save_defaults(result.settings, self.defaults_path)
                self.notify(f"Saved as the default for new chats ({path}).")
            except ValueError as e:
                self.notify(str(e), title="Defaults not saved", severity="error", timeout=10)
        if not self._chat.generating:
            self.reload_for(result.settings)

    def action_models(self) -> None:
        """Open the model library: pull models, switch pairs."""
        from edgespec.tui.screens.model_library import ModelsScreen

        try:
            library = self.library
        except EdgespecError as e:
            self.notify(str(e), title="Model library", severity="error", timeout=10)
            return
        self.push_screen(ModelsScreen(library, current=self.choice), self._model_chosen)

    def _model_chosen(self, choice: ModelChoice | None) -> None:
        if choice is None:
            return
        if self._chat.generating:
            self.notify("Stop the reply first (Esc), then switch models.", severity="warning")
            return
        if choice == self.choice and self.models.state != "failed":  # loading them again only loses their cache
            self.notify(f"{choice.label} is {'loaded' if self.models.state == 'ready' else 'being loaded'} already.")
            return
        self.load_models(choice)

    def get_system_commands(self, screen) -> Iterable[SystemCommand]:
        textuals = list(super().get_system_commands(screen))
        yield from textuals
        listed = {command.title for command in textuals}  # Textual's own (Quit) are not listed twice
        seen = set()
        for binding in ChatScreen.BINDINGS:
            node, action = (self, binding.action[4:]) if binding.action.startswith("app.") else (self._chat,
                                                                                                binding.action)
            method = getattr(node, f"action_{action}", None)
            if method is None or action in seen or binding.description in listed:
                continue
            seen.add(action)
            listed.add(binding.description)  # one command for each action, under its first key (stop: escape)
            doc = (method.__doc__ or "").strip().splitlines()[0] if method.__doc__ else ""
            yield SystemCommand(f"{binding.description} ({binding.key.split(',')[0]})", doc,
                                lambda action=action, node=node: self.run_action(action, node))

    # -- ending ------------------------------------------------------------------------
    def _take_ending_signals(self) -> None:
        """SIGTERM and SIGHUP (`kill`, the terminal closed) quit the app as its quit key does: Python's
        default ends the process at once, the terminal left in the app's screen and the reply lost.
        The handler only schedules the quit on the app's loop, which it may interrupt anywhere.
        Only on the main thread, where handlers run and are set."""
        if threading.current_thread() is not threading.main_thread():
            return
        loop = asyncio.get_running_loop()

        def ending(signum: int, _frame) -> None:
            loop.call_soon_threadsafe(self._end_by, signum)

        self._handlers_before = {sig: signal.signal(sig, ending) for sig in ENDING_SIGNALS}

    def _end_by(self, signum: int) -> None:
        self.ended_by = signum
        self.exit()

    def on_unmount(self) -> None:
        # Given back first: another signal while the app winds down ends it at once, as after
        # a command's (cli/signals.py), the saving cut short.
        for sig, handler in self._handlers_before.items():
            signal.signal(sig, handler)
        self._handlers_before = {}
        runtime = sys.modules.get("edgespec.engine.runtime")  # imported by any load (not at start: it is heavy)
        if runtime is not None:
            runtime.stop_loading()  # a load running now ends at its next report: quitting does not wait for it
        self._chat.stop_reply()
        engine = self.models.engine
        # The models are freed, and the store closed, once no decode uses them: a reply's worker
        # stores the stopped reply before it lets go of the decoding lock. Held past QUIT_WAIT_S
        # (or, with no models, held at all), both are left to the process's exit.
        if self.context.decoding.acquire(timeout=QUIT_WAIT_S if engine is not None else 0):
            if engine is not None:
                engine.close()
            if self._owns_store:
                self.store.close()
