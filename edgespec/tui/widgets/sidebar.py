"""The sidebar: stored conversations, newest first, with a search box. It lists
and searches; renaming and deleting a conversation are the chat screen's (its
keys, its dialogs), which then refreshes the list."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual import work
from textual.containers import Vertical
from textual.dom import DOMNode
from textual.message import Message
from textual.timer import Timer
from textual.widgets import Input, OptionList
from textual.widgets.option_list import Option
from textual.worker import get_current_worker

from edgespec.chat.store import ConversationInfo, StoreError, clean_title

SEARCH_PAUSE_S = 0.2
"""How long typing in the search box pauses before the list is searched: a search reads
the text of every conversation (tens to hundreds of milliseconds in a store of thousands,
on a busy machine) and the list is rebuilt after it, so a word typed at speed (a key
every 100-150 ms) is searched once, when the typing pauses, not once per key."""


def store_failed(node: DOMNode, error: StoreError) -> None:
    """Tell the user that the conversation store failed, and why."""
    node.notify(str(error), title="Conversations", severity="error", timeout=20)


class ConversationList(Vertical):
    """Search box over a list of conversations."""

    @dataclass
    class Selected(Message):
        """The user picked a conversation."""

        conversation_id: int

    def __init__(self, store, **kwargs) -> None:
        super().__init__(**kwargs)
        self.store = store
        self.current: int | None = None
        self._shown_search: str | None = None
        """The search whose conversations the list shows (None: all of them)."""
        self._pause: Timer | None = None
        """The timer that searches once the typing pauses."""

    def compose(self):
        yield Input(placeholder="Search chats (ctrl+f)", id="search")
        yield OptionList(id="conversations")

    def on_mount(self) -> None:
        self.refresh_list()

    def refresh_list(self) -> None:
        """Re-read the conversations matching the search text from the store: at once when there is
        none (listing alone is quick), else in a worker, off the UI thread, a newer search
        cancelling an older one."""
        search = self._search_text()
        if search is not None:
            self._search(search)
            return
        conversations = self._read(None)
        if conversations is not None:
            self._show(None, conversations)

    def _search_text(self) -> str | None:
        return self.query_one("#search", Input).value.strip() or None

    def _read(self, search: str | None) -> list[ConversationInfo] | None:
        """The conversations matching `search`, or None (said) when the store fails: the list stays as it was."""
        try:
            return self.store.list(search=search)
        except StoreError as e:
            store_failed(self, e)
            return None

    @dataclass
    class Searched(Message, bubble=False):
        """A search run off the UI thread ended: its conversations, or why the store failed."""

        search: str
        found: list[ConversationInfo] | StoreError

    @work(thread=True, exclusive=True, group="search")
    def _search(self, search: str) -> None:
        # The result comes back as a message, not through the app: the user may quit (and the
        # store close) mid-search, and a message to a closed widget is dropped, where reaching
        # for the app then raises or blocks at exit.
        try:
            found: list[ConversationInfo] | StoreError = self.store.list(search=search)
        except StoreError as e:
            found = e
        if not get_current_worker().is_cancelled:
            self.post_message(self.Searched(search, found))

    def on_conversation_list_searched(self, event: Searched) -> None:
        if isinstance(event.found, StoreError):
            store_failed(self, event.found)
        else:
            self._show(event.search, event.found)

    def _show(self, search: str | None, conversations: list[ConversationInfo]) -> None:
        """List `conversations`, found for `search`, unless the search text has changed since
        (a newer search is on its way)."""
        if search != self._search_text():
            return
        self._shown_search = search
        options = self.query_one("#conversations", OptionList)
        options.clear_options()
        # All at once: one by one, each option lays the list out again (260 ms for 3,000 chats, 90 at once).
        # Text, not a str: a str prompt is read as markup, and a title is the user's words (list[int], [/])
        options.add_options([Option(Text(clean_title(info.title) or "Untitled"), id=str(info.id))
                             for info in conversations])
        self.highlight(self.current)

    def highlight(self, conversation_id: int | None) -> None:
        """Show `conversation_id` as the current one."""
        self.current = conversation_id
        options = self.query_one("#conversations", OptionList)
        if conversation_id is None:
            options.highlighted = None
            return
        try:
            options.highlighted = options.get_option_index(str(conversation_id))
        except Exception:  # not in the filtered list
            options.highlighted = None

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        if self._pause is not None:
            self._pause.stop()
        self._pause = self.set_timer(SEARCH_PAUSE_S, self.refresh_list)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        """Enter in the search box opens the first match (searched now if the list does not show it yet)."""
        event.stop()
        search = self._search_text()
        if search != self._shown_search:  # typed and entered before the pause: search at once
            if self._pause is not None:
                self._pause.stop()
            conversations = self._read(search)
            if conversations is None:
                return
            self._show(search, conversations)
        options = self.query_one("#conversations", OptionList)
        if options.option_count:
            self.post_message(self.Selected(int(options.get_option_at_index(0).id)))

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.post_message(self.Selected(int(event.option.id)))
