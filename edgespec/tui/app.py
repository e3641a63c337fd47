"""The chat app: conversations in a sidebar, replies streamed as Markdown, a live
status line of speculation, and screens for models, settings and help.

Decoding and model loading run in thread workers; they touch widgets only by
posting messages, which never wait for the screen (a worker that waited on a
screen that is closing would never end). A reply's chunks go into a `ReplyBuffer` that the screen
drains on a timer: the decode thread never waits for a render, and the screen
redraws only as often as keeps its own CPU time within RENDER_SHARE. The app
is given how to load an engine and how to make a chat session, so tests run
it on a fake engine.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Awaitable, Callable, Iterable, Iterator

from rich.text import Text
from textual import on, work
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.reactive import reactive
from textual.widgets import Footer, Header, Static

from edgespec import __version__
from edgespec.chat.store import StoreError
from edgespec.engine.protocol import ChatEngine
from edgespec.errors import EdgespecError
from edgespec.tui.library import Library, ModelChoice, load_choice
from edgespec.tui.origin import chunk_spans, stored_spans
from edgespec.tui.screens.dialogs import ConfirmScreen, TextPromptScreen
from edgespec.tui.screens.help import HelpScreen
from edgespec.tui.screens.settings import SettingsResult, SettingsScreen
from edgespec.tui.settings import ChatSettings, load_defaults, save_defaults
from edgespec.tui.widgets.messages import MessageBox, code_blocks
from edgespec.tui.widgets.prompt import PromptInput
from edgespec.tui.widgets.sidebar import ConversationList
from edgespec.tui.widgets.status import StatusLine, format_live, hardware_label

EngineLoader = Callable[[ModelChoice, ChatSettings], ChatEngine]
"""(choice, settings) -> a loaded Engine; raises EdgespecError with a message for the user."""


RENDER_HZ = 15
"""The most a streaming reply is redrawn per second (smooth to the eye)."""

RENDER_WAIT_MAX = 1.0
"""The longest wait between redraws, whatever they cost: the reply must be seen to move."""

RENDER_SHARE = 0.02
"""The most of a CPU the screen may spend while a reply streams. On a CPU
llama.cpp decodes on every core, so what the screen draws is taken from
decoding, and re-rendering a growing Markdown reply costs more each time. The
screen measures its own CPU time and waits long enough after each redraw to
stay within this share."""

QUIT_WAIT_S = 30.0
"""How long quitting waits for the decode step in flight before leaving the
models to the process's exit: freeing them under a running decode would crash."""


class ReplyBuffer:
    """Chunks the decode thread has produced and the screen has not drawn yet."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._text: list[str] = []
        self._runs: list[tuple[str, bool]] = []
        self._stats = None

    def add(self, text: str, runs: list[tuple[str, bool]], stats) -> None:
        with self._lock:
            self._text.append(text)
            self._runs.extend(runs)
            self._stats = stats

    def take(self) -> tuple[str, list[tuple[str, bool]], object]:
        """Everything added since the last take: (text, runs, latest stats or None)."""
        with self._lock:
            taken = "".join(self._text), self._runs, self._stats
            self._text, self._runs, self._stats = [], [], None
        return taken


class RedrawTimer:
    """Calls `redraw` while a reply streams: at most RENDER_HZ times a second,
    and after each call waits until the screen's CPU time since the previous
    one is at most RENDER_SHARE of the time that passed, or RENDER_WAIT_MAX
    (Textual draws on the app's thread, so that thread's CPU time is what the
    screen costs)."""

    def __init__(self, app: App, redraw: Callable[[], Awaitable[None]]) -> None:
        self._app, self._redraw = app, redraw
        self._cpu = time.thread_time()
        self._timer = app.set_timer(1 / RENDER_HZ, self._tick)

    async def _tick(self) -> None:
        await self._redraw()
        cpu = time.thread_time()
        spent, self._cpu = cpu - self._cpu, cpu
        wait = min(max(1 / RENDER_HZ, spent / RENDER_SHARE), RENDER_WAIT_MAX)
        self._timer = self._app.set_timer(wait, self._tick)

    def stop(self) -> None:
        self._timer.stop()


def default_session_factory(engine, **kwargs):
    from edgespec.chat.session import ChatSession

    return ChatSession(engine, **kwargs)


class EdgespecApp(App):
    """Chat with local GGUF models, sped up by speculative decoding."""

    CSS_PATH = "app.tcss"
    TITLE = "edgespec"

    BINDINGS = [
        Binding("escape", "stop", "Stop reply", show=False),
        Binding("f1,question_mark", "help", "Help"),
        Binding("ctrl+n", "new_chat", "New chat", priority=True),
        Binding("ctrl+r", "regenerate", "Regenerate", priority=True),
        Binding("ctrl+g", "edit", "Edit & resend", priority=True),
        Binding("ctrl+t", "toggle_origin", "Token colours", priority=True),
        Binding("ctrl+s", "settings", "Settings"),
        Binding("ctrl+o", "models", "Models", priority=True),
        Binding("ctrl+f", "search", "Search chats", show=False, priority=True),
        Binding("ctrl+b", "toggle_sidebar", "Sidebar", show=False, priority=True),
        Binding("f2", "rename", "Rename chat", show=False, priority=True),
        Binding("f3", "export", "Export Markdown", show=False, priority=True),
        Binding("f5", "copy_reply", "Copy reply", show=False, priority=True),
        Binding("f6", "copy_code", "Copy code block", show=False, priority=True),
        Binding("f8", "delete", "Delete chat", show=False, priority=True),
    ]

    class ModelsLoaded(Message):
        def __init__(self, engine: ChatEngine, hardware: tuple) -> None:
            super().__init__()
            self.engine, self.hardware = engine, hardware

    class ModelsFailed(Message):
        def __init__(self, reason: str) -> None:
            super().__init__()
            self.reason = reason

    class ReplyEnded(Message):
        def __init__(self, box: MessageBox, error: str | None, pending: ReplyBuffer, redraws: RedrawTimer) -> None:
            super().__init__()
            self.box, self.error, self.pending, self.redraws = box, error, pending, redraws

    SCREEN_ACTIONS = {"help"}
    """Actions that also work while a dialog or another screen is open (others are for the chat)."""

    model_state: reactive[str] = reactive("loading")
    """"loading", "ready" or "failed"."""
    generating: reactive[bool] = reactive(False)
    """Whether a reply is being generated."""
    show_origin: reactive[bool] = reactive(False)
    """Whether replies show their tokens coloured by origin (draft vs target)."""

    def __init__(self, choice: ModelChoice | None = None, *, store=None,
                 load: EngineLoader | None = None, session_factory: Callable | None = None,
                 library: Library | Callable[[], Library] | None = None,
                 defaults: ChatSettings | None = None, defaults_path: str | Path | None = None,
                 export_dir: str | Path | None = None, template: str | None = None,
                 rpc: str | None = None) -> None:
        super().__init__()
        self.choice = choice or ModelChoice()
        self._store = store
        self._load = load or (lambda choice, settings: load_choice(choice, settings, library=self.library))
        self._session_factory = session_factory or default_session_factory
        self._library = library
        self.defaults_path = defaults_path
        self.defaults = defaults
        self.export_dir = Path(export_dir) if export_dir else Path.cwd()
        self.template = template
        """A built-in chat format's name (or Jinja source) instead of the GGUF's own."""
        self.rpc = rpc
        """RPC workers given on the command line: they replace the settings' for this run."""
        self.engine: ChatEngine | None = None
        self.session = None
        self.conversation_id: int | None = None
        self.settings: ChatSettings = defaults or ChatSettings()
        self.model_error = ""
        self.plain_tps: float | None = None
        """Decode speed of the last plain reply: the baseline for the speedup."""
        self._loaded_hardware: tuple | None = None
        self._stop = threading.Event()
        self._decoding = threading.Lock()
        """Held by the reply worker while it uses the engine."""
        self._store_problem = ""
        """What opening the conversation store needed telling (shown once the app is up)."""

    def check_action(self, action: str, parameters) -> bool | None:
        """Chat actions only act on the chat screen, not behind a dialog."""
        if action in self.SCREEN_ACTIONS or not any(b.action == action for b in self.BINDINGS):
            return True
        return len(self.screen_stack) == 1

    # -- pieces ------------------------------------------------------------------------
    @property
    def store(self):
        if self._store is None:
            from edgespec.chat.store import ConversationStore

            try:
                self._store = ConversationStore()
                self._store_problem = self._store.notice
            except StoreError as e:  # chat on, in memory, and say why nothing is saved
                self._store = ConversationStore(":memory:")
                self._store_problem = f"{e}\nConversations are not saved until this is fixed."
        return self._store

    def _store_failed(self, error: StoreError) -> None:
        self.notify(str(error), title="Conversations", severity="error", timeout=20)

    @property
    def library(self) -> Library:
        if self._library is None or (callable(self._library) and not hasattr(self._library, "rows")):
            from edgespec.tui.library import RegistryLibrary

            self._library = self._library() if callable(self._library) else RegistryLibrary()
        return self._library

    def compose(self):
        yield Header()
        with Horizontal(id="main"):
            yield ConversationList(self.store, id="sidebar")
            with Vertical(id="chat"):
                yield VerticalScroll(id="log")
                yield Static("", id="banner")
                yield PromptInput(id="prompt")
        yield StatusLine(id="status")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = f"v{__version__}"
        if self.defaults is None:
            try:
                self.defaults = load_defaults(self.defaults_path)
            except ValueError as e:
                self.defaults = ChatSettings()
                self.notify(str(e), title="Settings file ignored", severity="warning", timeout=10)
        if self.rpc is not None:
            self.defaults = replace(self.defaults, rpc=self.rpc)
        self.settings = self.defaults
        if self._store_problem:
            self.notify(self._store_problem, title="Conversations", severity="error", timeout=30)
        self.query_one("#log", VerticalScroll).anchor()
        self.query_one(PromptInput).focus()
        self.load_models(self.choice)

    @property
    def log_view(self) -> VerticalScroll:
        return self.query_one("#log", VerticalScroll)

    @property
    def status(self) -> StatusLine:
        return self.query_one(StatusLine)

    def show_banner(self, text: str) -> None:
        banner = self.query_one("#banner", Static)
        banner.update(Text(text))
        banner.display = bool(text)

    # -- models ------------------------------------------------------------------------
    def load_models(self, choice: ModelChoice) -> None:
        """Load `choice` in the background; the status line shows loading / ready / failed."""
        self.choice = choice
        self.model_state = "loading"
        self.status.model_label = choice.label
        self.status.detail = ""
        self.show_banner("")
        self._load_worker(choice, self.settings)

    @work(thread=True, exclusive=True, group="load")
    def _load_worker(self, choice: ModelChoice, settings: ChatSettings) -> None:
        old, self.engine = self.engine, None
        if old is not None:
            old.close()
        try:
            engine = self._load(choice, settings)
        except EdgespecError as e:
            self.post_message(self.ModelsFailed(str(e)))
            return
        except Exception as e:  # a bug or an unexpected library error: show it, don't crash
            self.post_message(self.ModelsFailed(f"{type(e).__name__}: {e}"))
            return
        if not self.post_message(self.ModelsLoaded(engine, settings.hardware())):
            engine.close()  # the app has closed meanwhile

    @on(ModelsLoaded)
    def _models_ready(self, event: ModelsLoaded) -> None:
        engine, hardware = event.engine, event.hardware
        self.engine = engine
        self._loaded_hardware = hardware
        self.model_error = ""
        self.model_state = "ready"
        try:
            info = engine.describe() or {}
        except Exception as e:  # the models work; only the label goes without where they run
            info = {}
            self.log.error(f"engine.describe() failed: {e!r}")
            self.notify(f"Could not tell where the models run: {e}", severity="warning")
        where = hardware_label(info)
        self.status.model_label = f"{self.choice.label}" + (f" ({where})" if where else "")
        self.session = self._make_session(self.conversation_id)

    @on(ModelsFailed)
    def _on_models_failed(self, event: ModelsFailed) -> None:
        self._models_failed(event.reason)

    def _models_failed(self, reason: str) -> None:
        self.model_error = reason
        self.model_state = "failed"
        self.status.detail = reason
        self.show_banner(f"Model failed to load: {reason}\nctrl+o opens the model library (pull or switch models).")

    def watch_generating(self, generating: bool) -> None:
        # A blinking cursor redraws the prompt twice a second, CPU taken from decoding.
        if self.is_mounted:
            self.query_one(PromptInput).cursor_blink = not generating

    def watch_model_state(self, state: str) -> None:
        if self.is_mounted:
            self.status.model_state = state

    def _make_session(self, conversation_id: int | None):
        """A chat session on the loaded engine; None (and the failed state) when there is no usable one."""
        if self.engine is None:
            return None
        try:
            return self._session_factory(
                self.engine, store=self.store, conversation_id=conversation_id,
                system_prompt=self.settings.system_prompt or None, params=self.settings.params(),
                template=self.template, model_name=self.choice.label or "the model",
            )
        except EdgespecError as e:  # e.g. no chat template in the GGUF
            self._models_failed(str(e))
            return None

    def _save_settings(self) -> None:
        """Store this conversation's settings (next to what the chat session stores there)."""
        if self.conversation_id is not None:
            try:
                stored = self.store.settings(self.conversation_id)
                self.store.save_settings(self.conversation_id, {**stored, **self.settings.to_dict()})
            except StoreError as e:
                self._store_failed(e)

    def _apply_system_prompt(self) -> None:
        """Give an existing conversation the system prompt of its settings."""
        session = self.session
        prompt = self.settings.system_prompt
        if session is None:
            return
        session.system_prompt = prompt or None
        messages = session.messages
        if messages and messages[0].role == "system":
            if prompt and messages[0].content != prompt:
                messages[0].content = prompt
                if messages[0].id is not None:
                    self.store.update(messages[0])
        elif prompt and not messages:
            session.new(system_prompt=prompt)

    # -- conversations -----------------------------------------------------------------
    async def open_conversation(self, conversation_id: int | None) -> None:
        """Show a stored conversation (None: a new, empty chat) and make it current."""
        try:
            stored = self.store.settings(conversation_id) if conversation_id is not None else {}
            messages = self.store.messages(conversation_id) if conversation_id is not None else []
        except StoreError as e:
            self._store_failed(e)
            return
        self.conversation_id = conversation_id
        try:
            self.settings = ChatSettings.from_dict(stored, defaults=self.defaults)
        except ValueError as e:
            self.settings = self.defaults
            self.notify(f"Stored settings ignored: {e}", severity="warning")
        await self.log_view.remove_children()
        await self.log_view.mount_all(self._message_boxes(messages))
        self.log_view.anchor()
        self.query_one(ConversationList).highlight(conversation_id)
        if self.session is not None:
            if conversation_id is None:
                self.session.new(system_prompt=self.settings.system_prompt or None)
            else:
                self.session.load(conversation_id)
            self.session.params = self.settings.params()
        elif self.engine is not None:
            self.session = self._make_session(conversation_id)
        if self._loaded_hardware not in (None, self.settings.hardware()):
            self.load_models(self.choice)

    def _message_boxes(self, messages) -> Iterable[MessageBox]:
        for m in messages:
            if m.role == "system":
                continue
            runs = stored_spans(self.engine, m.content, m.from_draft) if m.role == "assistant" else None
            yield MessageBox(m.role, m.content, status=m.status, stats=m.stats, runs=runs,
                             show_origin=self.show_origin)

    @on(ConversationList.Selected)
    async def _conversation_selected(self, event: ConversationList.Selected) -> None:
        if event.conversation_id == self.conversation_id:
            return
        if self.generating:
            self.notify("Stop the reply first (Esc).", severity="warning")
            self.query_one(ConversationList).highlight(self.conversation_id)
            return
        await self.open_conversation(event.conversation_id)

    async def action_new_chat(self) -> None:
        """Start a new, empty conversation."""
        if self.generating:
            self.notify("Stop the reply first (Esc).", severity="warning")
            return
        await self.open_conversation(None)
        self.query_one(PromptInput).focus()

    def action_search(self) -> None:
        """Search conversations by title."""
        self.query_one("#sidebar").display = True
        self.query_one("#search").focus()

    def action_toggle_sidebar(self) -> None:
        """Show or hide the conversation list."""
        sidebar = self.query_one("#sidebar")
        sidebar.display = not sidebar.display

    def action_rename(self) -> None:
        """Rename the current conversation."""
        cid = self.conversation_id
        if cid is None:
            self.notify("Nothing to rename yet: send a message first.")
            return
        current = self.store.title(cid) or ""

        def done(title: str | None) -> None:
            if title:
                try:
                    self.store.rename(cid, title)
                except StoreError as e:
                    self._store_failed(e)
                self.query_one(ConversationList).refresh_list()

        self.push_screen(TextPromptScreen("Rename chat", current, ok="Rename"), done)

    def action_delete(self) -> None:
        """Delete the current conversation (asks first)."""
        cid = self.conversation_id
        if cid is None or self.generating:
            return

        async def done(yes: bool | None) -> None:
            if yes:
                try:
                    self.store.delete(cid)
                except StoreError as e:
                    self._store_failed(e)
                    return
                self.query_one(ConversationList).refresh_list()
                await self.open_conversation(None)
                self.notify("Chat deleted.")

        self.push_screen(ConfirmScreen("Delete this chat and all its messages?", yes="Delete"), done)

    def action_export(self) -> None:
        """Export the current conversation to a Markdown file."""
        if self.conversation_id is None:
            self.notify("Nothing to export yet.")
            return
        title = self.store.title(self.conversation_id) or "chat"
        safe = "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in title).strip("-")[:40] or "chat"
        path = self.export_dir / f"edgespec-{self.conversation_id}-{safe}.md"
        try:
            path.write_text(self.store.export_markdown(self.conversation_id), encoding="utf-8")
        except StoreError as e:
            self._store_failed(e)
            return
        except OSError as e:
            self.notify(f"Cannot write {path}: {e.strerror or e}", title="Export", severity="error", timeout=10)
            return
        self.notify(f"Exported to {path}", title="Export")

    # -- sending and streaming -----------------------------------------------------------
    def _ready_to_generate(self) -> bool:
        if self.generating:
            self.notify("A reply is being generated (Esc stops it).", severity="warning")
            return False
        if self.model_state != "ready" or self.session is None:
            why = "still loading" if self.model_state == "loading" else f"not loaded: {self.model_error}"
            self.notify(f"The model is {why}", severity="warning")
            return False
        return True

    @on(PromptInput.Submitted)
    async def _send(self, event: PromptInput.Submitted) -> None:
        if not self._ready_to_generate():
            return
        text = event.text
        self.query_one(PromptInput).remember(text)
        await self.log_view.mount(MessageBox("user", text))
        session = self.session
        await self._start_reply(lambda: session.send(text))

    async def _start_reply(self, make_chunks: Callable[[], Iterator]) -> None:
        box = MessageBox("assistant", show_origin=self.show_origin)
        await self.log_view.mount(box)
        box.begin()
        self.log_view.anchor()
        self._stop.clear()
        self.generating = True
        pending = ReplyBuffer()
        redraws = RedrawTimer(self, lambda: self._show_pending(box, pending))
        self._reply_worker(make_chunks, box, pending, redraws)

    @work(thread=True, exclusive=True, group="reply")
    def _reply_worker(self, make_chunks: Callable[[], Iterator], box: MessageBox, pending: ReplyBuffer,
                      redraws: RedrawTimer) -> None:
        error = None
        chunks = None
        self._decoding.acquire()
        try:
            chunks = make_chunks()
            for chunk in chunks:
                if self._stop.is_set():
                    break
                pending.add(chunk.text, chunk_spans(self.engine, chunk.text, chunk.tokens, chunk.from_draft),
                            chunk.stats)
                if self._stop.is_set():
                    break
        except EdgespecError as e:
            error = str(e)
        except Exception as e:  # keep the app alive; the session stored the partial reply
            error = f"{type(e).__name__}: {e}"
        finally:
            try:
                if chunks is not None and hasattr(chunks, "close"):
                    chunks.close()  # a partial reply is stored as "stopped"
            except EdgespecError as e:
                error = error or str(e)
            finally:
                self._decoding.release()
            self.post_message(self.ReplyEnded(box, error, pending, redraws))

    async def _show_pending(self, box: MessageBox, pending: ReplyBuffer) -> None:
        text, runs, stats = pending.take()
        if text or runs:
            await box.write(text, runs)
        if stats is not None:
            self.status.detail = format_live(stats, plain_tps=self.plain_tps)
            self._follow_new_conversation()

    def _follow_new_conversation(self) -> None:
        """A new chat is stored at its first message: list it and remember its settings."""
        cid = self.session.conversation_id if self.session is not None else None
        if cid is not None and cid != self.conversation_id:
            self.conversation_id = cid
            self._save_settings()
            self.query_one(ConversationList).refresh_list()
            self.query_one(ConversationList).highlight(cid)

    @on(ReplyEnded)
    async def _reply_done(self, event: ReplyEnded) -> None:
        box, error, pending, redraws = event.box, event.error, event.pending, event.redraws
        redraws.stop()
        await self._show_pending(box, pending)
        messages = self.session.messages if self.session is not None else []
        last = messages[-1] if messages else None
        if last is not None and last.role == "assistant":
            content, status, stats = last.content, last.status, last.stats
        else:
            content, status, stats = box.content, "error" if error else "stopped", None
        if error:
            status = "error" if status == "done" else status
            self.notify(error, title="Generation failed", severity="error", timeout=10)
        await box.finish(content=content, status=status, stats=stats)
        if stats and stats.get("mode") == "plain" and stats.get("tokens_per_s"):
            self.plain_tps = stats["tokens_per_s"]
        self.generating = False
        self._follow_new_conversation()
        self._save_settings()
        self.query_one(ConversationList).refresh_list()

    def action_stop(self) -> None:
        """Stop the reply being generated (what was generated is kept)."""
        if self.generating:
            self._stop.set()

    def _target_box(self, role: str) -> MessageBox | None:
        """The focused message of `role`, else the last one."""
        focused = self.focused
        if isinstance(focused, MessageBox) and focused.role == role:
            return focused
        boxes = [b for b in self.log_view.query(MessageBox) if b.role == role]
        return boxes[-1] if boxes else None

    async def action_regenerate(self) -> None:
        """Generate the last reply again."""
        if not self._ready_to_generate():
            return
        boxes = list(self.log_view.query(MessageBox))
        if not boxes or boxes[-1].role != "assistant":
            self.notify("No reply to regenerate.")
            return
        await boxes[-1].remove()
        session = self.session
        await self._start_reply(lambda: session.regenerate())

    def action_edit(self) -> None:
        """Edit a user message (the focused one, else the last) and resend it."""
        box = self._target_box("user")
        if box is None or not self._ready_to_generate():
            return
        boxes = list(self.log_view.query(MessageBox))
        ordinal = [b for b in boxes if b.role == "user"].index(box)
        index = [i for i, m in enumerate(self.session.messages) if m.role == "user"][ordinal]

        async def done(text: str | None) -> None:
            if not text:
                return
            for later in boxes[boxes.index(box):]:
                await later.remove()
            await self.log_view.mount(MessageBox("user", text))
            session = self.session
            await self._start_reply(lambda: session.edit(index, text))

        self.push_screen(TextPromptScreen("Edit and resend (ctrl+s)", box.content, multiline=True, ok="Resend"), done)

    # -- clipboard, view ---------------------------------------------------------------
    def action_copy_reply(self) -> None:
        """Copy a reply (the focused one, else the last) to the clipboard."""
        box = self._target_box("assistant")
        if box is None:
            return
        self.copy_to_clipboard(box.content)
        self.notify("Reply copied.")

    def action_copy_code(self) -> None:
        """Copy the last code block of a reply (the focused one, else the last)."""
        box = self._target_box("assistant")
        blocks = code_blocks(box.content) if box else []
        if not blocks:
            self.notify("No code block in that reply.")
            return
        self.copy_to_clipboard(blocks[-1])
        self.notify("Code block copied.")

    def action_toggle_origin(self) -> None:
        """Colour replies by token origin: accepted draft tokens vs the target's own."""
        self.show_origin = not self.show_origin

    def watch_show_origin(self, show: bool) -> None:
        if not self.is_mounted:
            return
        self.status.origin_view = show
        for box in self.log_view.query(MessageBox):
            if show and not box.runs and box.role == "assistant" and box.content:
                m = box.content
                box.runs = stored_spans(self.engine, m, None)
            box.set_show_origin(show)

    # -- screens -------------------------------------------------------------------------
    def action_help(self) -> None:
        """Show the key bindings."""
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.BINDINGS))

    def action_settings(self) -> None:
        """Edit the settings of this conversation (or of new chats)."""
        title = None
        if self.conversation_id is not None:
            title = self.store.title(self.conversation_id)
        self.push_screen(SettingsScreen(self.settings, conversation_title=title), self._settings_saved)

    def _settings_saved(self, result: SettingsResult | None) -> None:
        if result is None:
            return
        self.settings = result.settings
        self._save_settings()
        if result.as_default:
            self.defaults = result.settings
            try:
                path = save_defaults(result.settings, self.defaults_path)
                self.notify(f"Saved as the default for new chats ({path}).")
            except ValueError as e:
                self.notify(str(e), title="Defaults not saved", severity="error", timeout=10)
        if self.session is not None and not self.generating:
            self.session.params = result.settings.params()
            self._apply_system_prompt()
        if self._loaded_hardware not in (None, result.settings.hardware()) and not self.generating:
            self.load_models(self.choice)

    def action_models(self) -> None:
        """Open the model library: pull models, switch pairs."""
        from edgespec.tui.screens.models import ModelsScreen

        try:
            library = self.library
        except EdgespecError as e:
            self.notify(str(e), title="Model library", severity="error", timeout=10)
            return
        self.push_screen(ModelsScreen(library, current=self.choice), self._model_chosen)

    def _model_chosen(self, choice: ModelChoice | None) -> None:
        if choice is None:
            return
        if self.generating:
            self.notify("Stop the reply first (Esc), then switch models.", severity="warning")
            return
        self.load_models(choice)

    def get_system_commands(self, screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        seen = set()
        for binding in self.BINDINGS:
            action = binding.action
            method = getattr(self, f"action_{action}", None)
            if method is None or action in seen:
                continue
            seen.add(action)
            doc = (method.__doc__ or "").strip().splitlines()[0] if method.__doc__ else ""
            yield SystemCommand(f"{binding.description} ({binding.key.split(',')[0]})", doc,
                                lambda action=action: self.run_action(action))

    def on_unmount(self) -> None:
        self._stop.set()
        if self.engine is not None and self._decoding.acquire(timeout=QUIT_WAIT_S):
            self.engine.close()
