"""What the chat layer gives the engine's lookup pool (Engine.remember/forget): the
names of its documents, and what a conversation's turn adds to what was remembered.

A conversation is one document, "conversation:<id>", that grows by each turn's
prompt and reply; a server request is "request:<hash of how it starts>", so a
client's conversation, sent again whole with each request, grows one document too.
"""

from __future__ import annotations

import hashlib
import json
from typing import Mapping, Sequence

ANCHOR = 32
"""Tokens at the end of what was remembered that a turn's tokens are searched for,
where its prompt no longer starts with them (its earliest turns left the context)."""
REQUEST_HEAD = 64
"""Tokens of a raw prompt that name its document."""


def conversation_doc(conversation_id: int | str) -> str:
    """The pool's document for a conversation of the store (or of a session unsaved)."""
    return f"conversation:{conversation_id}"


def request_doc(head: Sequence[Mapping[str, str]] | Sequence[int]) -> str:
    """The pool's document for a server request: a hash of its messages up to the first
    user message (or of a raw prompt's first REQUEST_HEAD tokens), so the next request
    of the same client conversation, which repeats them, continues the same document."""
    if head and isinstance(head[0], Mapping):
        first_user = next((i for i, m in enumerate(head) if m.get("role") == "user"), len(head) - 1)
        text = json.dumps([[m.get("role"), m.get("content")] for m in head[:first_user + 1]], default=str)
    else:
        text = json.dumps(list(head[:REQUEST_HEAD]))
    return "request:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def continued(known: Sequence[int], tokens: Sequence[int]) -> list[int]:
    """`known` (what was remembered of a conversation) followed by what `tokens` (this
    turn's prompt and reply) add to it: all of `tokens` where they start with `known`;
    else what follows the last place `known`'s end occurs in them (earlier turns were
    dropped from the prompt); else `tokens` alone (a history edited or a reply asked
    again: the conversation as it now reads)."""
    known, tokens = list(known), list(tokens)
    if tokens[:len(known)] == known:
        return tokens
    end = known[-ANCHOR:]
    for i in range(len(tokens) - len(end), -1, -1):
        if tokens[i:i + len(end)] == end:
            return known + tokens[i + len(end):]
    return tokens
