"""The chat screen: the conversation list, the message log, the prompt and the
status line, and what acts on a conversation (new, rename, delete, export, copy,
send, edit, regenerate, stop, token colours).

The screen is given one `ChatContext` (edgespec/tui/chat_context.py) and reads
nothing else of its app: the store, the project folder, the export folder, the
decoding lock, the session factory, the defaults, and the models, whose signals
it subscribes to (loading, ready, failed, and how far the files are). Through
the context it asks for the pair's decoding and for the models to be loaded
again when a conversation's settings want other hardware. Of `self.app` it uses
only Textual's App (screens, workers), which tests/test_tui_context.py checks. The
message log is a `Conversation` widget, which streams each reply in a thread
worker (holding the `decoding` lock it is given) and reports it as
`ReplyProgressed` and `ReplyEnded` messages.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

from rich.text import Text
from textual import on, work
from textual.actions import SkipAction
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer, Header, OptionList, Static, TextArea
from textual.widgets.option_list import Option
from textual.worker import get_current_worker

from edgespec.chat import attachments
from edgespec.chat.export import write_markdown
from edgespec.chat.remember import conversation_doc
from edgespec.chat.session import settled_words
from edgespec.chat.store import StoreError, clean_title
from edgespec.errors import EdgespecError, FileAccessError, terminal_text
from edgespec.tui.library import PullProgress
from edgespec.tui.screens.dialogs import ConfirmScreen, TextPromptScreen
from edgespec.tui.screens.diff import DiffScreen
from edgespec.tui.screens.picker import FilePickerScreen
from edgespec.tui.screens.model_library import describe_progress
from edgespec.tui.chat_settings import ChatSettings, give_session, store_settings
from edgespec.tui.chat_context import ChatContext
from edgespec.tui.widgets.chips import AttachmentBar, Chip
from edgespec.tui.widgets.conversation import Conversation
from edgespec.tui.widgets.prompt_input import PromptInput
from edgespec.tui.widgets.sidebar import ConversationList, store_failed
from edgespec.tui.widgets.status import StatusLine, format_live

READ_AHEAD_PAUSE_S = 0.4
"""A pause in the typing this long reads the words so far into the models
(ChatSession.read_ahead): sending then reads only the last of them. Short enough
that a message is read by the time it is sent; long enough that keystrokes do not
each start a reading (the screen and the reading share the CPU)."""

WAITING = "waiting for another edgespec replying in this conversation"
"""The status line while a reply waits for another edgespec's in the same conversation."""


class ChatScreen(Screen):
    """One conversation at a time, with the list of the others beside it."""

    BINDINGS = [
        Binding("escape", "stop", "Stop reply", show=False),
        # a terminal's interrupt key stops a reply (as in llama-cli and Ollama); with none under
        # way it keeps Textual's meaning (copy a selection, else say how to quit): action_interrupt
        Binding("ctrl+c", "interrupt", "Stop reply", show=False, priority=True),
        # the app's own help key, listed here too so that it leads the footer and the help table
        Binding("f1,question_mark", "app.help", "Help"),
        # Textual's quit key (which it leaves out of the footer), shown in the footer and the help table
        Binding("ctrl+q", "app.quit", "Quit", priority=True),
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
        Binding("f4", "attach", "Attach file", show=False, priority=True),
        Binding("f7", "review_edits", "Review edits", show=False, priority=True),
        Binding("f9", "undo_apply", "Undo apply", show=False, priority=True),
    ]

    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (60, "-wide")]
    """Below 60 columns the sidebar gives its 30 to the chat (app.tcss); ctrl+b still shows it."""

    VERTICAL_BREAKPOINTS = [(0, "-short"), (10, "-tall")]
    """Below 10 rows the header and the footer give their rows to the chat (app.tcss):
    at 5 rows they and the status line covered the prompt's row being typed in."""

    generating: reactive[bool] = reactive(False)
    """Whether a reply is being generated."""

    @dataclass
    class ReplyWaits(Message):
        """The reply waits for another edgespec replying in this conversation (posted from the reply's thread)."""

    def __init__(self, context: ChatContext) -> None:
        super().__init__()
        self.context = context
        """All that this screen is given of its app."""
        self._view = asyncio.Lock()
        """Held while the conversation view is cleared and filled, and while a message
        and its reply are added to it: a message sent meanwhile waits for the view."""
        self.session = None
        self.conversation_id: int | None = None
        self.settings = ChatSettings()
        """The settings of this conversation (or, for a new chat, the defaults)."""
        self.plain_tps: float | None = None
        """Decode speed of the last plain reply of the models loaded: the baseline for the speedup."""
        self._reading_ahead = False
        """A reading ahead (_read_ahead_worker) is under way."""
        self._typing_paused = None
        """The timer that reads the words ahead once the typing pauses (READ_AHEAD_PAUSE_S)."""
        self._read_words = ""
        """The words the last reading ahead read of the message (settled_words of it)."""
        self.applied: list = []
        """The edits written by the last apply (workspace.apply.Applied), for F9 to undo."""
        self._sent_chips: list[Chip] = []
        """The chips of the message sent last, given back should it be refused (_refused)."""
        self._settings_waiting = False
        """Settings were saved while a reply was generated: the session and the models take
        them when it ends (a reply goes on as it began)."""

    def check_action(self, action: str, parameters) -> bool | None:
        """Chat actions only act on this screen, not behind a dialog (the footer hides them there)."""
        if any(b.action == action for b in self.BINDINGS):
            return self.app.screen is self
        return True

    def compose(self):
        yield Header()
        with Horizontal(id="main"):
            yield ConversationList(self.context.store, id="sidebar")
            with Vertical(id="chat"):
                self._conversation = Conversation(self.context.decoding, id="log")
                yield self._conversation
                yield Static("", id="banner")
                yield OptionList(id="completions", markup=False)  # paths, as named: `[bold]y.txt`, `[/]z.txt`
                yield AttachmentBar(id="attachments")
                yield PromptInput(id="prompt", placeholder="Message (Enter sends; @path or F4 attaches a file)")
        yield StatusLine(id="status")
        yield Footer(compact=True)  # every key of the chat in 110 columns, quit among them

    def on_mount(self) -> None:
        self.log_view.anchor()
        prompt = self.query_one(PromptInput)
        prompt.attach_path = self._attach_pasted
        prompt.focus()
        self.query_one("#completions", OptionList).display = False
        models = self.context.models
        models.changed.subscribe(self, self._show_model_state, immediate=True)
        models.progressed.subscribe(self, self._show_load_progress, immediate=True)
        self._show_model_state(models.state)  # the app may have started loading before this screen was up
        if models.progress is not None:
            self._show_load_progress(models.progress)

    @property
    def log_view(self) -> Conversation:
        """The message log, and the reply being generated (kept after the screen's unmount: quitting stops it)."""
        return self._conversation

    @property
    def status(self) -> StatusLine:
        return self.query_one(StatusLine)

    def show_banner(self, text: str) -> None:
        banner = self.query_one("#banner", Static)
        banner.update(Text(terminal_text(text)))  # why models failed names their files, which may hold an escape
        banner.display = bool(text)

    # -- the models, as the app loads them -------------------------------------------------
    def _show_model_state(self, state: str) -> None:
        """Follow the models: loading, failed (and why), or ready to chat on."""
        models = self.context.models
        self.status.model_state = state
        self.status.model_label = models.label
        self.log_view.engine = models.engine if state == "ready" else None
        self.log_view.render_share = models.render_share
        if state == "loading":
            self.status.detail = ""
            self.show_banner("")
            self.plain_tps = None  # the speedup is over a plain reply of the models loaded
        elif state == "failed":
            self.status.detail = models.error
            self.show_banner(f"Model failed to load: {models.error}\n"
                             "ctrl+o opens the model library (pull or switch models).")
        elif state == "ready":
            self.status.detail = ""
            self.session = self._make_session(self.conversation_id)

    def _show_load_progress(self, progress: PullProgress) -> None:
        """While the models load: which file is being assembled, made or verified, and how far."""
        if self.context.models.state == "loading":
            self.status.detail = describe_progress(progress)

    def watch_generating(self, generating: bool) -> None:
        # A blinking cursor redraws the prompt twice a second, CPU taken from decoding.
        if self.is_mounted:
            self.query_one(PromptInput).cursor_blink = not generating

    def _make_session(self, conversation_id: int | None):
        """A chat session on the loaded engine; None (and the failed state) when there is no usable one."""
        context = self.context
        models = context.models
        if models.engine is None:
            return None
        try:
            return context.session_factory(
                models.engine, store=context.store, conversation_id=conversation_id,
                system_prompt=self.settings.system_prompt or None,
                params=self.settings.params(context.pair_decoding()),
                template=context.template, model_name=models.name or "the model",
                on_wait=lambda: self.post_message(self.ReplyWaits()), stop=self.log_view.stopping,
                workspace=context.workspace,
            )
        except EdgespecError as e:  # e.g. no chat template in the GGUF
            models.fail(str(e))
            return None

    # -- settings ------------------------------------------------------------------------
    def use_settings(self, settings: ChatSettings) -> None:
        """Make `settings` this conversation's: store them, and give them to its session,
        or, while a reply is being generated, once it has ended."""
        self.settings = settings
        self._save_settings()
        self._settings_waiting = self.generating
        if self.session is not None and not self.generating:
            give_session(self.session, settings, self.context.store, self.context.pair_decoding())

    def _save_settings(self) -> None:
        if self.conversation_id is not None:
            try:
                store_settings(self.context.store, self.conversation_id, self.settings)
            except StoreError as e:
                store_failed(self, e)

    # -- conversations -----------------------------------------------------------------
    async def open_conversation(self, conversation_id: int | None) -> None:
        """Show a stored conversation (None: a new, empty chat) and make it current."""
        async with self._view:
            await self._open_conversation(conversation_id)

    async def _open_conversation(self, conversation_id: int | None) -> None:
        self._stop_reading_ahead()  # it reads the conversation being left
        context = self.context
        try:
            stored = context.store.settings(conversation_id) if conversation_id is not None else {}
            messages = context.store.messages(conversation_id) if conversation_id is not None else []
        except StoreError as e:
            store_failed(self, e)
            return
        self.conversation_id = conversation_id
        if context.models.state == "ready":  # the last reply's statistics are another chat's (loading or failed: kept)
            self.status.detail = ""
        try:
            self.settings = ChatSettings.from_dict(stored, defaults=context.defaults)
        except ValueError as e:
            self.settings = context.defaults
            self.notify(f"Stored settings ignored: {e}", severity="warning")
        await self.log_view.show(messages)
        self.query_one(ConversationList).highlight(conversation_id)
        if self.session is not None:
            if conversation_id is None:
                self.session.new(system_prompt=self.settings.system_prompt or None)
            else:
                self.session.load(conversation_id)
            self.session.params = self.settings.params(context.pair_decoding())
        elif context.models.engine is not None:
            self.session = self._make_session(conversation_id)
        if self.session is not None:
            self.session.private = self.settings.private  # as stored, or the defaults for a new chat
        context.reload_for(self.settings)

    @on(ConversationList.Selected)
    async def _conversation_selected(self, event: ConversationList.Selected) -> None:
        """Open the chosen conversation, and give the keys to the prompt: what is typed next is a message."""
        if event.conversation_id != self.conversation_id:
            if self.generating:
                self.notify("Stop the reply first (Esc).", severity="warning")
                self.query_one(ConversationList).highlight(self.conversation_id)
                return
            await self.open_conversation(event.conversation_id)
        self.query_one(PromptInput).focus()

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
        self.follow_new_conversation()  # stored with its first message, before the reply's first token
        if self.conversation_id is None:
            self.notify("Nothing to rename yet: send a message first.")
            return
        cid, store = self.conversation_id, self.context.store
        try:
            title = clean_title(store.title(cid) or "")  # as the sidebar shows it (older rows were stored as written)
        except StoreError as e:
            store_failed(self, e)
            return

        def done(title: str | None) -> None:
            if title:
                try:
                    store.rename(cid, title)
                except StoreError as e:
                    store_failed(self, e)
                self.query_one(ConversationList).refresh_list()

        self.app.push_screen(TextPromptScreen("Rename chat", title, ok="Rename"), done)

    def action_delete(self) -> None:
        """Delete the current conversation and all its messages (asks first)."""
        if self.generating:
            self.notify("Stop the reply first (Esc), then delete the chat.", severity="warning")
            return
        self.follow_new_conversation()
        if self.conversation_id is None:
            self.notify("Nothing to delete: this chat is not stored yet.")
            return
        cid = self.conversation_id

        async def done(yes: bool | None) -> None:
            if not yes:
                return
            try:
                self.context.store.delete(cid)
            except StoreError as e:
                store_failed(self, e)
                return
            models = self.context.models
            self.app.run_worker(lambda: forget_conversation(models.engine, cid), thread=True, group="forget")
            self.query_one(ConversationList).refresh_list()
            await self.open_conversation(None)
            self.notify("Chat deleted.")

        self.app.push_screen(ConfirmScreen("Delete this chat and all its messages?", yes="Delete"), done)

    def action_export(self) -> None:
        """Export the current conversation to a Markdown file."""
        self.follow_new_conversation()  # stored with its first message, before the reply's first token
        if self.conversation_id is None:
            self.notify("Nothing to export yet.")
            return
        try:
            path = write_markdown(self.context.store, self.conversation_id, self.context.export_dir)
        except StoreError as e:
            store_failed(self, e)
            return
        except OSError as e:
            self.notify(f"Cannot write {e.filename}: {e.strerror or e}", title="Export", severity="error", timeout=10)
            return
        self.notify(f"Exported to {path}", title="Export")

    # -- sending and streaming -----------------------------------------------------------
    def _ready_to_generate(self) -> bool:
        if self.generating:
            self.notify("A reply is being generated (Esc stops it).", severity="warning")
            return False
        models = self.context.models
        if models.state != "ready" or self.session is None:
            why = "still loading" if models.state == "loading" else f"not loaded: {models.error}"
            self.notify(f"The model is {why}", severity="warning")
            return False
        return True

    @on(PromptInput.Submitted)
    async def _send(self, event: PromptInput.Submitted) -> None:
        text = event.text
        if not text:
            paths = self.query_one(AttachmentBar).paths
            if paths:  # a message is the words: the files alone ask nothing
                self.notify(f"Write what to ask about {', '.join(paths)}, then Enter sends "
                            f"{'it' if len(paths) == 1 else 'them'}.")
            return
        if not self._ready_to_generate():
            return
        named = self._at_files(text)
        refused = next((why for _, why in named if why is not None), None)
        if refused is not None:  # sent without it, the model would answer about a file it never saw
            self.notify(f"{refused} Take the @ away to send the path as text.", title="Not sent", severity="error")
            return
        bar = self.query_one(AttachmentBar)
        files = [*bar.paths, *(p for p, _ in named if p is not None and p not in bar.paths)]
        self.query_one(PromptInput).remember(text)
        self._sent_chips = list(bar.chips)
        await bar.clear_chips()
        async with self._view:
            if not self._ready_to_generate():  # the conversation opened meanwhile may not be usable
                await self._give_back(text, files)
                return
            self._start_reply()
            await self.log_view.send(self.session, text, files)

    @on(Conversation.Refused)
    async def _refused(self, event: Conversation.Refused) -> None:
        """A message refused before anything of it was stored (a file gone, too long for
        the context) goes back to the prompt, with its chips, for the user to fix and send
        again; words typed meanwhile are kept after it. An edit goes back to its editor. Refused
        because the chat is gone (deleted by another edgespec, or by `edgespec` on the command
        line), it is left for a new chat: staying, every message would be refused."""
        if self.conversation_id is not None and self._deleted(self.conversation_id):
            await self.open_conversation(None)
            self.notify("This chat was deleted (by another edgespec, or on the command line): your message "
                        "is back, to send in a new chat.", title="Chat deleted", severity="warning", timeout=10)
        elif event.edited is not None:
            self._edit(event.edited, event.text)
            return
        await self._give_back(event.text, event.files)

    async def _give_back(self, text: str, files: list[str]) -> None:
        """Put a message that was not sent back in the prompt, before the words typed since,
        with the chips it was sent with of `files`."""
        prompt = self.query_one(PromptInput)
        prompt.load_text(f"{text}\n{prompt.text}" if prompt.text else text)
        prompt.move_cursor(prompt.document.end)
        bar = self.query_one(AttachmentBar)
        for chip in self._sent_chips:
            if chip.path in files:
                await bar.add(chip)
        self._sent_chips = []
        prompt.focus()

    def _deleted(self, conversation_id: int) -> bool:
        """Whether the store no longer holds the conversation (False where it cannot tell)."""
        try:
            return self.context.store.title(conversation_id) is None
        except StoreError:
            return False

    @on(ReplyWaits)
    def _reply_waits(self, event: ReplyWaits) -> None:
        self.status.detail = WAITING
        self.notify("Another edgespec is replying in this conversation: this reply starts once that one is "
                    "stored (Esc gives up).", title="Waiting", timeout=10)

    @on(Conversation.ReplyProgressed)
    def _reply_progressed(self, event: Conversation.ReplyProgressed) -> None:
        self.status.detail = format_live(event.stats, plain_tps=self.plain_tps)
        self.follow_new_conversation()

    def follow_new_conversation(self) -> None:
        """A new chat is stored at its first message: list it and remember its settings."""
        cid = self.session.conversation_id if self.session is not None else None
        if cid is not None and cid != self.conversation_id:
            self.conversation_id = cid
            self._save_settings()
            self.query_one(ConversationList).refresh_list()
            self.query_one(ConversationList).highlight(cid)

    @on(Conversation.ReplyEnded)
    def _reply_ended(self, event: Conversation.ReplyEnded) -> None:
        if event.error:
            self.notify(event.error, title="Generation failed", severity="error", timeout=10)
        stats = event.stats
        if stats and stats.mode == "plain" and stats.tokens_per_s:
            self.plain_tps = stats.tokens_per_s
        self.generating = False
        if self.status.detail == WAITING:  # the wait was given up: no reply, nothing to wait for
            self.status.detail = ""
        self.follow_new_conversation()
        deleted = self.conversation_id is not None and self._deleted(self.conversation_id)
        if deleted:  # in another process, meanwhile: the next message goes to a new chat (_refused)
            self.notify("This chat was deleted (by another edgespec, or on the command line) while it replied: "
                        "the reply is shown here, not stored.", title="Chat deleted", severity="warning", timeout=10)
        if self._settings_waiting:  # saved during the reply: the session and the models take them now
            self.use_settings(self.settings)
            self.context.reload_for(self.settings)
        if not deleted:
            self._save_settings()
        self.query_one(ConversationList).refresh_list()
        if event.status == "done":
            self.action_review_edits(quiet=True)
        self._read_ahead()  # the reply, into a draft model that sat it out, while the next message is written

    def stop_reply(self) -> None:
        """Ask the reply worker to stop at its next chunk (or batch of the prompt)."""
        self.log_view.stop()

    def action_stop(self) -> None:
        """Stop the reply being generated (what was generated is kept); else close the `@path`
        completions, or else stop the reading ahead of attached files."""
        if self.generating:
            self.stop_reply()
        elif not self._close_completions():
            self._stop_reading_ahead()

    def _close_completions(self) -> bool:
        """Hide the `@path` completions until the text changes (False: none were shown)."""
        prompt = self.query_one(PromptInput)
        if not prompt.completing:
            return False
        self.query_one("#completions", OptionList).display = prompt.completing = False
        return True

    def action_interrupt(self) -> None:
        """Stop the reply being generated; with none, leave the key to the focused widget and the app."""
        if not self.generating:
            raise SkipAction()
        self.stop_reply()

    async def action_regenerate(self) -> None:
        """Generate the last reply again."""
        log = self.log_view
        if log.target_box("assistant", self.focused) is not log.target_box("assistant", None):
            # an earlier reply focused: regenerating the last would throw away one not pointed at
            self.notify("Only the last reply can be regenerated: ctrl+g edits and resends the message this "
                        "reply answers, replacing the turns after it.")
            return
        if not self._ready_to_generate():
            return
        self._start_reply()
        if not await self.log_view.regenerate(self.session):
            self.generating = False
            self.notify("No reply to regenerate.")

    def action_edit(self) -> None:
        """Edit a user message (the focused one, or the one the focused reply answers, else the last) and resend it."""
        box = self.log_view.asked_box(self.focused)
        if box is None:
            self.notify("No message to edit yet.")
            return
        if not self._ready_to_generate():
            return
        self._edit(self.log_view.session_index(self.session, box), box.content)

    def _edit(self, index: int, text: str) -> None:
        """Open `text` in the editor, to resend as the user message at `index` in the session."""
        async def done(new: str | None) -> None:
            if new:
                self._start_reply()
                await self.log_view.resend(self.session, index, new)

        self.app.push_screen(TextPromptScreen("Edit and resend (ctrl+s)", text, multiline=True, ok="Resend"), done)

    # -- clipboard, view ---------------------------------------------------------------
    def action_copy_reply(self) -> None:
        """Copy a reply (the focused one, else the last) to the clipboard."""
        self.log_view.copy_reply(self.focused)

    def action_copy_code(self) -> None:
        """Copy the last code block of a reply (the focused one, else the last)."""
        self.log_view.copy_code(self.focused)

    def action_toggle_origin(self) -> None:
        """Colour replies by token origin: accepted draft tokens vs the target's own."""
        self.log_view.show_origin = self.status.origin_view = not self.log_view.show_origin

    # -- files: attach, review a reply's edits, apply, undo -------------------------------
    def _attach_file(self, path: str) -> None:
        """Show `path` (relative to the project folder) as a chip on the message being written."""
        try:
            file = self.context.workspace.read(path)
        except EdgespecError as e:
            self.notify(str(e), title="Not attached", severity="error")
            return
        engine = self.context.models.engine
        tokens = len(engine.tokenize(file.text, special=False)) if engine is not None else None
        self.run_worker(self._add_chip(Chip(file.path, file.size, tokens)))

    async def _add_chip(self, chip: Chip) -> None:
        if await self.query_one(AttachmentBar).add(chip):
            self._read_ahead()
        else:
            self.notify(f"{chip.path} is attached already.")

    def _read_ahead(self) -> None:
        """Read the conversation, the attached files and the words written so far into
        the models while the message is being written (ChatSession.read_ahead): sending
        then reads only its last words."""
        session = self.session
        if session is None or self.generating or self.context.models.state != "ready":
            return
        text = self.query_one(PromptInput).text
        bar = self.query_one(AttachmentBar)
        named = (p for p, _ in self._at_files(text) if p is not None)
        files = [*bar.paths, *(p for p in named if p not in bar.paths)]  # as _send attaches them
        self._read_words = settled_words(text)
        self._read_ahead_worker(session, files, text)

    @work(thread=True, exclusive=True, group="read-ahead")
    def _read_ahead_worker(self, session, paths: list[str], words: str) -> None:
        # After a reply or an earlier reading ahead; a message sent meanwhile waits
        # for this one, which reads what that message needs first.
        with self.context.decoding:
            if get_current_worker().is_cancelled:  # more came: the worker started for it reads
                return
            self._reading_ahead = True
            try:
                session.read_ahead(paths, words)
            except Exception:
                # Work nobody asked for must not end the app: sending reads the
                # whole prompt again and says what went wrong, in its place.
                pass
            finally:
                self._reading_ahead = False

    @on(TextArea.Changed, "#prompt")
    def _typed(self, event: TextArea.Changed) -> None:
        """Read the words ahead once the typing pauses (READ_AHEAD_PAUSE_S); stop a reading
        of words taken back (a long paste replaced: the message sent would wait for it)."""
        if not event.text_area.text.startswith(self._read_words):
            self._stop_reading_ahead()
        if self._typing_paused is not None:
            self._typing_paused.stop()
        self._typing_paused = self.set_timer(READ_AHEAD_PAUSE_S, self._read_ahead)

    def _stop_reading_ahead(self) -> None:
        """Stop a reading ahead whose message changed or is gone (a file removed, words
        taken back, another conversation, Esc): reading a large file takes a minute on a CPU, and
        the message sent next would wait for it. What was read stays in the cache.
        Never a reply's: the engine stops whatever decodes, so only while none is
        asked for (a message sent waits for the reading, under the decoding lock)."""
        engine = self._reading_engine()
        if engine is not None:
            engine.interrupt()

    def _start_reply(self) -> None:
        """A reply is asked for (sent, regenerated, resent). A reading ahead still in its
        drafters' part (a draft model catching up with the last reply: seconds at a long
        context on a CPU) is stopped, keeping what it read, so that the reply does not
        wait for a reading it may not use; its warming decides whether the model reads
        on. The target's part, which the prompt needs, is left to end."""
        engine = self._reading_engine()
        if engine is not None:
            engine.interrupt_drafters_reading()
        self.generating = True

    def _reading_engine(self):
        """The engine while it reads ahead and no reply is asked for (None otherwise): its
        interrupts then stop that reading, never a reply's decode."""
        engine = self.context.models.engine
        return engine if self._reading_ahead and not self.generating else None

    def _attach_pasted(self, line: str) -> bool:
        """A pasted line that names a file of the project folder attaches it (False: it is
        text). One that names a file that cannot be attached (a link out of the folder, a
        loop) is pasted as text, and why it was not attached is said."""
        path, why = self._project_file(line)
        if path is not None:
            self._attach_file(path)
        elif why is not None:
            self.notify(why, title="Not attached", severity="warning")
        return path is not None

    def _at_files(self, text: str) -> list[tuple[str | None, str | None]]:
        """What the `@path` words of `text` name (_project_file)."""
        return [self._project_file(word[1:]) for word in text.split() if word.startswith("@") and len(word) > 1]

    def _project_file(self, text: str) -> tuple[str | None, str | None]:
        """`text` as the path of a file in the project folder, relative to it; or, where it
        names something that cannot be attached (a link out of the folder, a loop), why.
        (None, None): it names nothing there, and is only text."""
        workspace = self.context.workspace
        try:
            full = workspace.resolve(text)
            return (workspace.relative(full) if full.is_file() else None), None
        except EdgespecError as e:
            try:
                there = os.path.lexists(workspace.root / text)  # (an absolute path replaces the root)
            except ValueError:  # a NUL: not a path at all
                there = False
            return None, str(e) if there else None
        except (OSError, ValueError):
            return None, None

    @on(AttachmentBar.Removed)
    async def _chip_removed(self, event: AttachmentBar.Removed) -> None:
        self._stop_reading_ahead()
        await self.query_one(AttachmentBar).remove_path(event.path)
        self._read_ahead()  # the files left (what they share with the stopped reading is kept)
        self.query_one(PromptInput).focus()

    def action_attach(self) -> None:
        """Attach a file of the project folder to the message (a tree to choose from)."""
        def done(path: str | None) -> None:
            if path:
                self._attach_file(path)
            self.query_one(PromptInput).focus()

        self.app.push_screen(FilePickerScreen(self.context.workspace), done)

    @on(TextArea.Changed, "#prompt")
    def _complete(self, event: TextArea.Changed) -> None:
        """Offer the paths that complete an `@path` being typed."""
        prompt, options = self.query_one(PromptInput), self.query_one("#completions", OptionList)
        word = prompt.at_word()
        found = self.context.workspace.complete(word[0], limit=8) if word is not None else []
        options.clear_options()
        # shown fit for a terminal (a name may hold an escape), chosen by the path itself
        options.add_options(Option(terminal_text(path), id=path) for path in found)
        if found:
            options.highlighted = 0
        options.display = prompt.completing = bool(found)

    @on(PromptInput.CompletionChosen)
    def _completion_chosen(self, event: PromptInput.CompletionChosen) -> None:
        """Tab: a folder completes the `@path`, a file becomes a chip and leaves the text."""
        prompt, options = self.query_one(PromptInput), self.query_one("#completions", OptionList)
        word = prompt.at_word()
        if word is None or options.highlighted is None:
            return
        choice = options.get_option_at_index(options.highlighted).id
        row, column = prompt.cursor_location
        if choice.endswith("/"):
            prompt.replace(f"@{choice}", (row, word[1]), (row, column))
        else:
            prompt.replace("", (row, word[1]), (row, column))
            self._attach_file(choice)

    def action_review_edits(self, quiet: bool = False) -> None:
        """Show the last reply's changes to attached files as a diff, to apply them
        (`quiet`: as a reply ends, saying nothing where there are none, and only
        announcing them while a message is being written)."""
        try:
            edits = self.session.pending_edits() if self.session is not None else []
        except EdgespecError as e:  # a change that does not apply (a diff whose context is not in the file)
            self.notify(str(e), title="The reply's changes cannot be applied", severity="warning", timeout=10)
            return
        if not edits:
            if not quiet:
                self.notify("The last reply's changes are applied (F9 undoes them)."
                            if self.session is not None and self.session.applied_already()
                            else "The last reply changes none of the attached files.")
            return
        if self.app.screen is not self:
            return
        if quiet and self.query_one(PromptInput).text.strip():
            # A message is being written: opened now, the diff would take its keys ("a" applies).
            self.notify(f"The reply changes {len(edits)} file{'s' if len(edits) != 1 else ''}: F7 shows the diff "
                        "to apply.", title="Changes to review")
            return

        def done(apply: bool | None) -> None:
            if not apply:
                return
            new = [p.path for p in edits if p.edit.new]
            if new:
                self.app.push_screen(ConfirmScreen(f"Create {', '.join(new)}? The conversation never attached "
                                                   f"{'it' if len(new) == 1 else 'them'}.", yes="Create"),
                                     lambda yes: self._apply(edits) if yes else None)
            else:
                self._apply(edits)

        self.app.push_screen(DiffScreen(self.context.workspace, edits), done)

    def _apply(self, edits) -> None:
        from edgespec.config import dirs

        try:
            applied, written = attachments.apply_edits(self.context.workspace, edits, allow_new=True,
                                                       backups=dirs().data / "undo")
            self.session.record_applied(written)
        except (EdgespecError, StoreError) as e:
            left = e.left_changed if isinstance(e, FileAccessError) else ()  # written, and not put back
            self.notify(str(e), title=f"Partly applied: {', '.join(left)} left changed" if left else "Not applied",
                        severity="error", timeout=10)
            return
        self.applied = applied
        self.notify(f"Applied to {', '.join(a.path for a in applied)} (F9 undoes).", title="Edits applied")

    def action_undo_apply(self) -> None:
        """Put back the files the last apply wrote (while nobody changed them since)."""
        if not self.applied:
            self.notify("Nothing applied to undo.")
            return
        try:
            attachments.undo_edits(self.context.workspace, self.applied)
        except EdgespecError as e:
            self.notify(str(e), title="Not undone", severity="error", timeout=10)
            return
        self.notify(f"Undone: {', '.join(a.path for a in self.applied)} restored.", title="Undo")
        self.applied = []


def forget_conversation(engine, conversation_id: int) -> None:
    """Remove a deleted conversation from the lookup pool: from the engine's, and from
    every pool file (remembered under another model, or the engine still loading).
    Reads and writes files: off the UI thread."""
    doc = conversation_doc(conversation_id)
    if engine is not None:
        engine.forget(doc)
        return
    from edgespec.engine.pool import forget_everywhere
    from edgespec.load import pool_folder

    forget_everywhere(pool_folder(), doc)
