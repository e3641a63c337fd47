"""The sidebar: stored conversations, newest first, with a search box. It lists
and searches; renaming and deleting a conversation are the chat screen's (its
keys, its dialogs), which then refreshes the list."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.containers import Vertical
from textual.dom import DOMNode
from textual.message import Message
from textual.widgets import Input, OptionList
from textual.widgets.option_list import Option

from edgespec.chat.store import StoreError, clean_title


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

    def compose(self):
        yield Input(placeholder="Search chats (ctrl+f)", id="search")
        yield OptionList(id="conversations")

    def on_mount(self) -> None:
        self.refresh_list()

    def refresh_list(self) -> None:
        """Re-read the conversations (matching the search text) from the store."""
        search = self.query_one("#search", Input).value.strip() or None
        options = self.query_one("#conversations", OptionList)
        try:
            conversations = self.store.list(search=search)
        except StoreError as e:  # the list stays as it was: the chat goes on
            store_failed(self, e)
            return
        options.clear_options()
        for info in conversations:
            # Text, not a str: a str prompt is read as markup, and a title is the user's words (list[int], [/])
            options.add_option(Option(Text(clean_title(info.title) or "Untitled"), id=str(info.id)))
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
        self.refresh_list()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        """Enter in the search box opens the first match."""
        event.stop()
        options = self.query_one("#conversations", OptionList)
        if options.option_count:
            self.post_message(self.Selected(int(options.get_option_at_index(0).id)))

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.post_message(self.Selected(int(event.option.id)))
