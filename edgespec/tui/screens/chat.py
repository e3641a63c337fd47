"""The chat screen: the conversation list, the message log, the prompt and the
status line; sending, streaming replies, and what acts on a conversation (new,
rename, delete, export, copy, edit, regenerate, stop, token colours).

The models, the engine, the defaults and the store belong to the app
(`EdgespecApp`); this screen asks it for them and tells it when a conversation's
settings want the models loaded again. A reply is decoded by a thread worker
that hands its chunks to a `ReplyBuffer` and reports its end as a `ReplyEnded`
message; it holds the app's `decoding` lock while it uses the engine.
"""

from __future__ import annotations

import asyncio

import threading
from typing import Callable, Iterable, Iterator

from rich.text import Text
from textual import on, work
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer, Header, Static

from edgespec.chat.export import export_markdown
from edgespec.chat.store import StoreError
from edgespec.errors import EdgespecError
from edgespec.tui.library import PullProgress
from edgespec.tui.origin import chunk_spans, stored_spans
from edgespec.tui.screens.dialogs import ConfirmScreen, TextPromptScreen
from edgespec.tui.screens.models import describe_progress
from edgespec.tui.settings import ChatSettings
from edgespec.tui.stream import RedrawTimer, ReplyBuffer
from edgespec.tui.widgets.messages import MessageBox, code_blocks
from edgespec.tui.widgets.prompt import PromptInput
from edgespec.tui.widgets.sidebar import ConversationList
from edgespec.tui.widgets.status import StatusLine, format_live


class ChatScreen(Screen):
    """One conversation at a time, with the list of the others beside it."""

    BINDINGS = [
        Binding("escape", "stop", "Stop reply", show=False),
        # the app's own help key, listed here too so that it leads the footer and the help table
        Binding("f1,question_mark", "app.help", "Help"),
        Binding("ctrl+n", "new_chat", "New chat", priority=True),
        Binding("ctrl+r", "regenerate", "Regenerate", priority=True),
        Binding("ctrl+g", "edit", "Edit & resend", priority=True),
        Binding("ctrl+t", "toggle_origin", "Token colours", priority=True),
        Binding("ctrl+s", "app.settings", "Settings"),
        Binding("ctrl+o", "app.models", "Models", priority=True),
        Binding("ctrl+f", "search", "Search chats", show=False, priority=True),
        Binding("ctrl+b", "toggle_sidebar", "Sidebar", show=False, priority=True),
        Binding("f2", "rename", "Rename chat", show=False, priority=True),
        Binding("f3", "export", "Export Markdown", show=False, priority=True),
        Binding("f5", "copy_reply", "Copy reply", show=False, priority=True),
        Binding("f6", "copy_code", "Copy code block", show=False, priority=True),
        Binding("f8", "delete", "Delete chat", show=False, priority=True),
    ]

    class ReplyEnded(Message):
        def __init__(self, box: MessageBox, error: str | None, pending: ReplyBuffer, redraws: RedrawTimer) -> None:
            super().__init__()
            self.box, self.error, self.pending, self.redraws = box, error, pending, redraws

    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (60, "-wide")]
    """Below 60 columns the sidebar gives its 30 to the chat (app.tcss); ctrl+b still shows it."""

    generating: reactive[bool] = reactive(False)
    """Whether a reply is being generated."""
    show_origin: reactive[bool] = reactive(False)
    """Whether replies show their tokens coloured by origin (draft vs target)."""

    def __init__(self) -> None:
        super().__init__()
        self._view = asyncio.Lock()
        """Held while the conversation view is cleared and filled, and while a message
        and its reply are added to it: a message sent meanwhile waits for the view."""
        self.session = None
        self.conversation_id: int | None = None
        self.settings = ChatSettings()
        """The settings of this conversation (or, for a new chat, the defaults)."""
        self.plain_tps: float | None = None
        """Decode speed of the last plain reply: the baseline for the speedup."""
        self._stop = threading.Event()

    def check_action(self, action: str, parameters) -> bool | None:
        """Chat actions only act on this screen, not behind a dialog (the footer hides them there)."""
        if any(b.action == action for b in self.BINDINGS):
            return self.app.screen is self
        return True

    def compose(self):
        yield Header()
        with Horizontal(id="main"):
            yield ConversationList(self.app.store, id="sidebar")
            with Vertical(id="chat"):
                yield VerticalScroll(id="log")
                yield Static("", id="banner")
                yield PromptInput(id="prompt")
        yield StatusLine(id="status")
        yield Footer()

    def on_mount(self) -> None:
        self.log_view.anchor()
        self.query_one(PromptInput).focus()
        self.watch(self.app, "model_state", self._show_model_state)
        self.watch(self.app, "load_progress", self._show_load_progress)

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

    def _store_failed(self, error: StoreError) -> None:
        self.notify(str(error), title="Conversations", severity="error", timeout=20)

    # -- the models, as the app loads them -------------------------------------------------
    def _show_model_state(self, state: str) -> None:
        """Follow the app's models: loading, failed (and why), or ready to chat on."""
        app = self.app
        self.status.model_state = state
        self.status.model_label = app.model_label
        if state == "loading":
            self.status.detail = ""
            self.show_banner("")
        elif state == "failed":
            self.status.detail = app.model_error
            self.show_banner(f"Model failed to load: {app.model_error}\n"
                             "ctrl+o opens the model library (pull or switch models).")
        elif state == "ready":
            self.status.detail = ""
            self.session = self._make_session(self.conversation_id)

    def _show_load_progress(self, progress: PullProgress | None) -> None:
        """While the models load: which file is being assembled, made or verified, and how far."""
        if progress is not None and self.app.model_state == "loading":
            self.status.detail = describe_progress(progress)

    def watch_generating(self, generating: bool) -> None:
        # A blinking cursor redraws the prompt twice a second, CPU taken from decoding.
        if self.is_mounted:
            self.query_one(PromptInput).cursor_blink = not generating

    def _make_session(self, conversation_id: int | None):
        """A chat session on the loaded engine; None (and the failed state) when there is no usable one."""
        app = self.app
        if app.engine is None:
            return None
        try:
            return app.session_factory(
                app.engine, store=app.store, conversation_id=conversation_id,
                system_prompt=self.settings.system_prompt or None, params=self.settings.params(),
                template=app.template, model_name=app.choice.label or "the model",
            )
        except EdgespecError as e:  # e.g. no chat template in the GGUF
            app.models_failed(str(e))
            return None

    # -- settings ------------------------------------------------------------------------
    def use_settings(self, settings: ChatSettings) -> None:
        """Make `settings` this conversation's: store them, and give them to its session
        unless a reply is being generated."""
        self.settings = settings
        self._save_settings()
        if self.session is not None and not self.generating:
            self.session.params = settings.params()
            self._apply_system_prompt()

    def _save_settings(self) -> None:
        """Store this conversation's settings (next to what the chat session stores there)."""
        if self.conversation_id is not None:
            store = self.app.store
            try:
                stored = store.settings(self.conversation_id)
                store.save_settings(self.conversation_id, {**stored, **self.settings.to_dict()})
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
                    self.app.store.update(messages[0])
        elif prompt and not messages:
            session.new(system_prompt=prompt)

    # -- conversations -----------------------------------------------------------------
    async def open_conversation(self, conversation_id: int | None) -> None:
        """Show a stored conversation (None: a new, empty chat) and make it current."""
        async with self._view:
            await self._open_conversation(conversation_id)

    async def _open_conversation(self, conversation_id: int | None) -> None:
        app = self.app
        try:
            stored = app.store.settings(conversation_id) if conversation_id is not None else {}
            messages = app.store.messages(conversation_id) if conversation_id is not None else []
        except StoreError as e:
            self._store_failed(e)
            return
        self.conversation_id = conversation_id
        try:
            self.settings = ChatSettings.from_dict(stored, defaults=app.defaults)
        except ValueError as e:
            self.settings = app.defaults
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
        elif app.engine is not None:
            self.session = self._make_session(conversation_id)
        app.reload_for(self.settings)

    def _message_boxes(self, messages) -> Iterable[MessageBox]:
        for m in messages:
            if m.role == "system":
                continue
            runs = stored_spans(self.app.engine, m.content, m.from_draft) if m.role == "assistant" else None
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
        cid, store = self.conversation_id, self.app.store
        if cid is None:
            self.notify("Nothing to rename yet: send a message first.")
            return
        current = store.title(cid) or ""

        def done(title: str | None) -> None:
            if title:
                try:
                    store.rename(cid, title)
                except StoreError as e:
                    self._store_failed(e)
                self.query_one(ConversationList).refresh_list()

        self.app.push_screen(TextPromptScreen("Rename chat", current, ok="Rename"), done)

    def action_delete(self) -> None:
        """Delete the current conversation (asks first)."""
        cid, store = self.conversation_id, self.app.store
        if cid is None or self.generating:
            return

        async def done(yes: bool | None) -> None:
            if yes:
                try:
                    store.delete(cid)
                except StoreError as e:
                    self._store_failed(e)
                    return
                self.query_one(ConversationList).refresh_list()
                await self.open_conversation(None)
                self.notify("Chat deleted.")

        self.app.push_screen(ConfirmScreen("Delete this chat and all its messages?", yes="Delete"), done)

    def action_export(self) -> None:
        """Export the current conversation to a Markdown file."""
        cid, store = self.conversation_id, self.app.store
        if cid is None:
            self.notify("Nothing to export yet.")
            return
        title = store.title(cid) or "chat"
        safe = "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in title).strip("-")[:40] or "chat"
        path = self.app.export_dir / f"edgespec-{cid}-{safe}.md"
        try:
            path.write_text(export_markdown(store, cid), encoding="utf-8")
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
        app = self.app
        if app.model_state != "ready" or self.session is None:
            why = "still loading" if app.model_state == "loading" else f"not loaded: {app.model_error}"
            self.notify(f"The model is {why}", severity="warning")
            return False
        return True

    @on(PromptInput.Submitted)
    async def _send(self, event: PromptInput.Submitted) -> None:
        if not self._ready_to_generate():
            return
        text = event.text
        self.query_one(PromptInput).remember(text)
        async with self._view:
            if not self._ready_to_generate():  # the conversation opened meanwhile may not be usable
                return
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
        redraws = RedrawTimer(self, lambda: self._show_pending(box, pending), self.app.render_share)
        self._reply_worker(make_chunks, box, pending, redraws)

    @work(thread=True, exclusive=True, group="reply")
    def _reply_worker(self, make_chunks: Callable[[], Iterator], box: MessageBox, pending: ReplyBuffer,
                      redraws: RedrawTimer) -> None:
        error = None
        chunks = None
        engine, decoding = self.app.engine, self.app.decoding
        decoding.acquire()
        try:
            chunks = make_chunks()
            for chunk in chunks:
                if self._stop.is_set():
                    break
                pending.add(chunk.text, chunk_spans(engine, chunk.text, chunk.tokens, chunk.from_draft),
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
                decoding.release()
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

    def stop_reply(self) -> None:
        """Ask the reply worker to stop at its next chunk (or batch of the prompt)."""
        self._stop.set()

    def action_stop(self) -> None:
        """Stop the reply being generated (what was generated is kept)."""
        if self.generating:
            self.stop_reply()

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

        self.app.push_screen(TextPromptScreen("Edit and resend (ctrl+s)", box.content, multiline=True,
                                              ok="Resend"), done)

    # -- clipboard, view ---------------------------------------------------------------
    def action_copy_reply(self) -> None:
        """Copy a reply (the focused one, else the last) to the clipboard."""
        box = self._target_box("assistant")
        if box is None:
            return
        self.app.copy_to_clipboard(box.content)
        self.notify("Reply copied.")

    def action_copy_code(self) -> None:
        """Copy the last code block of a reply (the focused one, else the last)."""
        box = self._target_box("assistant")
        blocks = code_blocks(box.content) if box else []
        if not blocks:
            self.notify("No code block in that reply.")
            return
        self.app.copy_to_clipboard(blocks[-1])
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
                box.runs = stored_spans(self.app.engine, box.content, None)
            box.set_show_origin(show)
