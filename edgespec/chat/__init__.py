"""The chat layer: templates, sessions with KV-cache reuse, and the conversation store."""

from edgespec.chat.session import ChatSession
from edgespec.chat.store import ConversationInfo, ConversationStore, Message, StoreError
from edgespec.chat.template import BUILTIN_FORMATS, ChatTemplate, chat_template, encode_prompt

__all__ = ["BUILTIN_FORMATS", "ChatSession", "ChatTemplate", "ConversationInfo", "ConversationStore",
           "Message", "StoreError", "chat_template", "encode_prompt"]
