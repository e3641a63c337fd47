"""The chat layer: templates, prompts, sessions with KV-cache reuse, and the conversation store."""

from edgespec.chat.prompt import Prompt, PromptEncoder, Region, encode_prompt
from edgespec.chat.session import ChatSession
from edgespec.chat.store import ConversationInfo, ConversationStore, Message, StoreError
from edgespec.chat.template import BUILTIN_FORMATS, ChatTemplate, chat_template

__all__ = ["BUILTIN_FORMATS", "ChatSession", "ChatTemplate", "ConversationInfo", "ConversationStore",
           "Message", "Prompt", "PromptEncoder", "Region", "StoreError", "chat_template", "encode_prompt"]
